"""Several sources in ``[data] train``: globs, concatenation in order, mixing weights that are
deterministic and resume exactly, and one-line errors naming the source."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from hyper_core.builtin.stages import _load_source
from hyper_core.cli import main
from hyper_core.config import dump_config, load_config, load_config_dict
from hyper_core.config.schema import DataSource
from hyper_core.data.sources import mixing_slots
from hyper_core.errors import ConfigError
from hyper_core.testing import isolated_host, read_metrics, run_tiny_training, tiny_text_config
from hyper_core.testing.processes import hyper_train

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def _cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HYPER_TRAIN_CACHE", str(tmp_path / "cache"))


def chat_line(text: str) -> str:
    messages = [{"role": "user", "content": f"Repeat: {text}"}]
    return json.dumps({"messages": [*messages, {"role": "assistant", "content": text}]})


def write(path: Path, n: int, bad: tuple[int, ...] = ()) -> Path:
    """``n`` samples (line ``i + 1`` invalid JSON when ``i`` is in ``bad``)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = ["{oops" if i in bad else chat_line(f"{path.stem} {i}") for i in range(n)]
    path.write_text("".join(line + "\n" for line in lines))
    return path


def load(tmp_path: Path, train: Any, seed: int = 0) -> list[tuple[str, int]]:
    """``(file name, line)`` of each raw sample of ``train``, in order."""
    config = load_config_dict(
        tiny_text_config(tmp_path / "out", data={"train": train}, run={"seed": seed})
    )
    samples = _load_source(config.data.train, config, isolated_host().registries, "train")
    return [(Path(s["_source"]["file"]).name, s["_source"]["line"]) for s in samples]


@pytest.fixture
def files(tmp_path: Path) -> Path:
    write(tmp_path / "a.jsonl", 3)
    write(tmp_path / "b" / "2.jsonl", 2)
    write(tmp_path / "b" / "1.jsonl", 4)
    return tmp_path


def test_files_and_globs_are_read_one_after_the_other(files: Path) -> None:
    got = load(files, [str(files / "a.jsonl"), str(files / "b" / "*.jsonl")])
    assert got == [
        *(("a.jsonl", i) for i in (1, 2, 3)),
        *(("1.jsonl", i) for i in (1, 2, 3, 4)),  # the glob's files sorted
        *(("2.jsonl", i) for i in (1, 2)),
    ]


def test_a_single_glob_source_and_relative_paths(files: Path) -> None:
    config_dir = files / "cfg"
    config_dir.mkdir()
    raw = tiny_text_config(files / "out", data={"train": "../b/*.jsonl"})
    (config_dir / "train.toml").write_text(dump_config(load_config_dict(raw)))
    config = load_config(config_dir / "train.toml", ())
    samples = _load_source(config.data.train, config, isolated_host().registries, "train")
    assert [Path(s["_source"]["file"]).name for s in samples] == ["1.jsonl"] * 4 + ["2.jsonl"] * 2


def test_a_file_named_like_a_glob_is_read_as_written(tmp_path: Path) -> None:
    write(tmp_path / "a[1].jsonl", 2)
    write(tmp_path / "a1.jsonl", 3)  # what the pattern a[1].jsonl would match
    assert load(tmp_path, str(tmp_path / "a[1].jsonl")) == [("a[1].jsonl", 1), ("a[1].jsonl", 2)]


def test_weights_give_the_documented_counts(files: Path) -> None:
    train = [
        {"path": str(files / "a.jsonl"), "weight": 2.0},
        {"path": str(files / "b" / "*.jsonl"), "weight": 0.5},
    ]
    got = load(files, train)
    counts = Counter(got)
    # a: every sample twice; b/1 (4 samples): a subset of 2; b/2 (2 samples): a subset of 1
    assert {k: v for k, v in counts.items() if k[0] == "a.jsonl"} == {
        ("a.jsonl", 1): 2,
        ("a.jsonl", 2): 2,
        ("a.jsonl", 3): 2,
    }
    b1 = [k for k in got if k[0] == "1.jsonl"]
    b2 = [k for k in got if k[0] == "2.jsonl"]
    assert len(b1) == 2 and len(set(b1)) == 2 and len(b2) == 1
    assert len(got) == 6 + 2 + 1


def test_fractional_weights_add_a_seeded_subset() -> None:
    slots = mixing_slots([10, 100], [1.5, 0.25], seed=7)
    first, second = slots[slots < 10], slots[slots >= 10] - 10
    assert sorted(Counter(first.tolist()).values()) == [1] * 5 + [2] * 5  # 10 + round(5)
    assert len(second) == 25 and len(set(second.tolist())) == 25  # round(25), no repeats
    assert np.array_equal(slots, mixing_slots([10, 100], [1.5, 0.25], seed=7))
    assert not np.array_equal(slots, mixing_slots([10, 100], [1.5, 0.25], seed=8))


def test_mixing_is_deterministic_across_loads(files: Path) -> None:
    train = [{"path": str(files / "b" / "*.jsonl"), "weight": 1.5}]
    assert load(files, train) == load(files, train)
    assert load(files, train, seed=0) != load(files, train, seed=3)


def test_a_resumed_mixed_run_continues_the_same_sequence(files: Path, tmp_path: Path) -> None:
    demo = tiny_text_config(tmp_path)["data"]["train"]
    train = [{"path": demo, "weight": 0.5}, {"path": str(files / "b" / "*.jsonl"), "weight": 3.0}]
    checkpoint = {"every_steps": 2, "keep_last": None, "resume": "auto"}

    def config(out: Path, steps: int) -> dict[str, Any]:
        return tiny_text_config(
            out,
            data={"train": train},
            training={"steps": steps, "lr_scheduler": "constant"},
            checkpoint=checkpoint,
        )

    straight = run_tiny_training(config(tmp_path / "straight", 4))
    run_tiny_training(config(tmp_path / "resumed", 2))
    resumed = run_tiny_training(config(tmp_path / "resumed", 4))
    losses = {m["step"]: m["loss"] for m in read_metrics(resumed.output_dir) if "loss" in m}
    expected = {m["step"]: m["loss"] for m in straight.metrics if "loss" in m}
    assert sorted(losses) == [1, 2, 3, 4]
    assert losses == pytest.approx(expected, rel=1e-6, abs=1e-6)


def test_an_eval_list_slices_across_its_files(files: Path) -> None:
    evaluation = [str(files / "b" / "*.jsonl"), str(files / "a.jsonl")]
    config = load_config_dict(
        tiny_text_config(files / "out", data={"eval": evaluation, "eval_samples": 5})
    )
    samples = _load_source(config.data.eval, config, isolated_host().registries, "eval")
    head = samples[: config.data.eval_samples]
    got = [(Path(s["_source"]["file"]).name, s["_source"]["line"]) for s in head]
    assert got == [("1.jsonl", 1), ("1.jsonl", 2), ("1.jsonl", 3), ("1.jsonl", 4), ("2.jsonl", 1)]
    assert len(samples) == 9


def test_config_forms_round_trip(files: Path) -> None:
    train = ["a.jsonl", {"path": "b/*.jsonl", "weight": 0.5}]
    config = load_config_dict(tiny_text_config(files / "out", data={"train": train}))
    assert config.data.train == [
        DataSource(format="jsonl", path="a.jsonl"),
        DataSource(format="jsonl", path="b/*.jsonl", weight=0.5),
    ]
    (files / "run.toml").write_text(dump_config(config))
    assert load_config(files / "run.toml", ()).data.train == config.data.train
    single = load_config_dict(tiny_text_config(files / "out", data={"train": "a.jsonl"}))
    assert single.data.train == DataSource(format="jsonl", path="a.jsonl")  # unchanged form
    assert '\ntrain = "a.jsonl"\n' in dump_config(single)


@pytest.mark.parametrize(
    ("train", "where", "message"),
    [
        ([], "$.data.train", "must not be an empty array"),
        (["a.jsonl", {"path": "b.jsonl", "weight": 0}], "$.data.train[1].weight", "must be > 0"),
        (["a.jsonl", "b.txt"], "$.data.train[1]", "cannot infer the format of 'b.txt'"),
        (["a.jsonl", {"path": "b.jsonl", "max_samples": 0}], "$.data.train[1].max_samples", "must"),
    ],
)
def test_bad_source_lists_name_the_element(
    tmp_path: Path, train: Any, where: str, message: str
) -> None:
    with pytest.raises(ConfigError) as info:
        load_config_dict(
            tiny_text_config(tmp_path, data={"train": train}), registries=isolated_host().registries
        )
    problems = dict(info.value.problems)
    assert problems[where].startswith(message), problems


def test_a_glob_matching_nothing_is_one_line_exit_2(files: Path) -> None:
    train = json.dumps([str(files / "a.jsonl"), str(files / "c" / "*.jsonl")])
    proc = hyper_train(
        ["data", "stats", str(REPO / "configs" / "text_demo.toml"), f"--data.train={train}"]
    )
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.splitlines() == [
        f"hyper-train: error: $.data.train[1].path: no file matches '{files / 'c' / '*.jsonl'}'"
    ]
    assert proc.stdout == ""


def test_data_stats_reads_every_file_with_its_own_lines(
    files: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = write(files / "b" / "2.jsonl", 2, bad=(1,))
    train = json.dumps([str(files / "a.jsonl"), str(files / "b" / "*.jsonl")])
    code = main(
        ["data", "stats", str(REPO / "configs" / "text_demo.toml"), f"--data.train={train}"]
    )
    out, err = capsys.readouterr()
    assert code == 0, err
    assert out.splitlines()[0] == "samples: 9 read of 9, 8 usable, 1 bad"
    assert f"  invalid_json: 1 ({bad}:2)" in out.splitlines()
