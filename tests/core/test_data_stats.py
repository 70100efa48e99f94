"""``hyper-train data stats``: bad samples by reason and place, per-sample counts, predicted
padding equal to the runtimes' own, and one-line errors."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from hyper_core.batching.base import BatchingOptions
from hyper_core.batching.packed import PackedRuntime
from hyper_core.batching.padded import PaddedRuntime
from hyper_core.batching.types import IGNORE_INDEX
from hyper_core.cli import main
from hyper_core.config import load_config
from hyper_core.data.dataset import Skipped, TransformedDataset
from hyper_core.data.jsonl import read_jsonl
from hyper_core.data.stats import Batching, micro_batch_groups, predict_padding
from hyper_core.plugins import get_plugin_host
from hyper_core.resolve import resolve_adapter

REPO = Path(__file__).resolve().parents[2]
CONFIG = str(REPO / "configs" / "text_demo.toml")
WORDS = ["stone", "a long answer with several words in it", "x", "island river", "ok", "tea"]


def chat_line(question: str, answer: str) -> str:
    messages = [{"role": "user", "content": question}, {"role": "assistant", "content": answer}]
    return json.dumps({"messages": messages})


def write_data(path: Path, n: int, bad: dict[int, str]) -> Path:
    """``n`` lines; line ``i + 1`` is ``bad[i]`` verbatim when given, else a valid sample."""
    lines = [bad.get(i) or chat_line(f"Repeat: {WORDS[i % 6]}", WORDS[i % 6]) for i in range(n)]
    path.write_text("".join(line + "\n" for line in lines))
    return path


def stats(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(["data", "stats", CONFIG, *args])
    out, err = capsys.readouterr()
    return code, out, err


def reference_features(path: Path) -> list[Any]:
    """Each line through the adapter's transform directly (no plugin host stages)."""
    config = load_config(CONFIG, ())
    adapter = resolve_adapter(config.model, get_plugin_host().registries)
    assets = adapter.build_assets(config.model)

    def transform(sample: Any) -> Any:
        return adapter.transform(sample, assets=assets, max_seq_len=config.data.max_seq_len)

    return list(TransformedDataset(read_jsonl(path), transform))


def test_bad_lines_are_counted_by_reason_with_file_and_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = write_data(tmp_path / "train.jsonl", 20, {2: "{not json", 5: "[1]", 9: "{oops", 14: "{"})
    code, out, err = stats(capsys, f"--data.train={data}")
    assert code == 0, err
    assert out.splitlines()[0] == "samples: 20 read of 20, 16 usable, 4 bad"
    assert f"  invalid_json: 3 ({data}:3, {data}:10, {data}:15)" in out.splitlines()
    assert f"  bad_format: 1 ({data}:6)" in out.splitlines()
    # Each reason shows its first sample and what is wrong with it.
    lines = out.splitlines()
    example = lines[lines.index(f"  bad_format: 1 ({data}:6)") + 1]
    assert example.startswith(f"    e.g. {data}:6: ") and "object" in example, example


def test_a_missing_data_file_is_one_line_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = stats(capsys, f"--data.train={tmp_path / 'nope.jsonl'}")
    assert code == 2
    (line,) = err.splitlines()
    assert line.startswith("hyper-train: error: ") and f"{tmp_path}/nope.jsonl" in line, err
    assert out == ""


def test_a_bad_samples_option_is_one_line_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = stats(capsys, "--samples", "0")
    assert code == 2
    assert err.splitlines() == ["hyper-train: error: --samples: expected at least 1, got 0"]


def test_json_numbers_equal_a_hand_computation(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = write_data(tmp_path / "train.jsonl", 7, {3: "{bad"})
    code, out, err = stats(
        capsys,
        f"--data.train={data}",
        "--training.global_batch_size=4",
        "--training.micro_batch_size=2",
        "--json",
    )
    assert code == 0, err
    report = json.loads(out)
    features = reference_features(data)
    good = [f for f in features if not isinstance(f, Skipped)]
    tokens = sorted(int(f.input_ids.shape[0]) for f in good)  # 6 values
    loss = sorted(int((f.labels != IGNORE_INDEX).sum()) for f in good)
    assert len(set(tokens)) > 1  # the test data has different lengths
    assert report["samples"] == {"total": 7, "read": 7, "usable": 6, "bad": 1}
    assert list(report["bad"]) == ["invalid_json"]
    assert report["bad"]["invalid_json"]["count"] == 1
    assert report["bad"]["invalid_json"]["first"] == [f"{data}:4"]
    assert report["bad"]["invalid_json"]["example"].startswith(f"{data}:4: ")
    # median: the lower middle value (index 2 of 6); p90: nearest rank ceil(5.4) = 6th value.
    assert report["per_sample"]["tokens"] == {
        "min": tokens[0],
        "median": tokens[2],
        "p90": tokens[5],
        "max": tokens[5],
        "total": sum(tokens),
    }
    assert report["per_sample"]["loss_tokens"]["total"] == sum(loss)
    assert report["per_sample"]["images"]["total"] == 0
    assert sum(c for _, _, c in report["histogram"]["tokens"]) == 6
    # Steps of 4 samples: [0, 1, 2, bad] then [4, 5, 6]; micro-batches of 2.
    lengths = [int(f.input_ids.shape[0]) for f in good]
    groups = [lengths[0:2], lengths[2:3], lengths[3:5], lengths[5:6]]
    padded = sum(len(g) * max(g) - sum(g) for g in groups)
    assert report["padding"]["padded"]["micro_batches"] == 4
    assert report["padding"]["padded"]["padding"] == padded
    assert report["padding"]["packed"]["padding"] == 0
    assert report["batching"]["micro_batches_per_step"] == 2
    assert report["steps_per_epoch"] == 1  # 7 // 4


def test_samples_limits_the_read(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = write_data(tmp_path / "train.jsonl", 30, {25: "{bad"})
    code, out, err = stats(capsys, f"--data.train={data}", "--samples", "10", "--json")
    assert code == 0, err
    report = json.loads(out)
    assert report["samples"] == {"total": 30, "read": 10, "usable": 10, "bad": 0}
    assert report["per_sample"]["tokens"]["total"] < 30 * report["per_sample"]["tokens"]["min"]
    assert report["steps_per_epoch"] == 30 // 16


def test_world_size_divides_the_micro_batches(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = write_data(tmp_path / "train.jsonl", 32, {})
    code, out, err = stats(
        capsys, f"--data.train={data}", "--parallel.strategy=ddp", "--nproc-per-node", "2", "--json"
    )
    assert code == 0, err
    report = json.loads(out)
    assert report["batching"]["world_size"] == 2
    assert report["batching"]["micro_batches_per_step"] == 1  # 16 = 8 × 1 × 2
    assert report["padding"]["padded"]["micro_batches"] == 4


def test_context_parallel_ranks_share_their_micro_batches(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Two ranks of one ``cp = 2`` group read the same rows: one data-parallel rank's count."""
    data = write_data(tmp_path / "train.jsonl", 32, {})
    cp = ["--parallel.strategy=fsdp2", "--parallel.cp=2", "--model.attn_implementation=varlen"]
    code, out, err = stats(capsys, f"--data.train={data}", *cp, "--nproc-per-node", "2", "--json")
    assert code == 0, err
    report = json.loads(out)
    assert report["batching"]["world_size"] == 1
    assert report["batching"]["micro_batches_per_step"] == 2  # 16 = 8 × 2 × 1


@pytest.mark.parametrize("multiple", [1, 8])
@pytest.mark.parametrize("world", [1, 2])
def test_predicted_padding_matches_the_runtimes(tmp_path: Path, multiple: int, world: int) -> None:
    bad = {i: "{bad" for i in (3, 4, 11, 17)}
    features = reference_features(write_data(tmp_path / "train.jsonl", 23, bad))
    batching = Batching(
        global_batch_size=8, micro_batch_size=3, world_size=world, pad_to_multiple_of=multiple
    )
    options = BatchingOptions(
        micro_batch_size=3, max_seq_len=256, pad_token_id=0, pad_to_multiple_of=multiple
    )
    lengths = [None if isinstance(f, Skipped) else f.length for f in features]
    predicted = predict_padding(lengths, batching)
    for name, runtime in (("padded", PaddedRuntime(options)), ("packed", PackedRuntime(options))):
        micro_batches = []
        for begin in range(0, len(features), 8):  # the loader's steps, each rank's share
            step = features[begin : begin + 8]
            for r in range(world):
                share = step[r * len(step) // world : (r + 1) * len(step) // world]
                usable = [f for f in share if not isinstance(f, Skipped)]
                micro_batches += runtime.collate(usable) if usable else []
        assert predicted[name].micro_batches == len(micro_batches)
        assert predicted[name].padding == sum(mb.num_padding for mb in micro_batches)
        assert predicted[name].tokens == sum(mb.num_tokens for mb in micro_batches)
    assert predicted["padded"].padding > 0
    assert (predicted["packed"].padding > 0) == (multiple > 1)


def test_micro_batch_groups_split_each_step_by_rank() -> None:
    batching = Batching(global_batch_size=4, micro_batch_size=2, world_size=2)
    groups = list(micro_batch_groups([1, 2, None, 4, 5, 6, 7], batching))
    assert groups == [[1, 2], [4], [5], [6, 7]]


def test_no_usable_sample_exits_3_with_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = write_data(tmp_path / "train.jsonl", 20, {i: "{bad" for i in range(20)})
    code, out, err = stats(capsys, f"--data.train={data}")
    assert code == 3
    (line,) = err.splitlines()
    assert line.startswith(
        "hyper-train: error: no usable sample: all 20 read are bad (invalid_json=20); "
        f"e.g. {data}:1: invalid_json: "
    ), line
    assert "steps per epoch" not in out
    assert out.splitlines()[0] == "samples: 20 read of 20, 0 usable, 20 bad"
    code, out, _ = stats(capsys, f"--data.train={data}", "--json")
    assert code == 3 and json.loads(out)["samples"]["usable"] == 0
