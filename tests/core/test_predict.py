"""``hyper-train predict``: batched answers equal one-at-a-time chat answers, one line per sample
in input order (bad samples as errors), the printed metrics are those of the written lines,
every way of naming the model gives the same predictions, and 2 ranks equal 1."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest

from hyper_core.cli import main
from hyper_core.config import dump_config, load_config_dict
from hyper_core.generation import GenerationSettings
from hyper_core.plugins import get_plugin_host
from hyper_core.testing import run_tiny_training, tiny_text_config
from hyper_core.testing.processes import hyper_train
from hyper_core.text_metrics import TextScores
from hyper_core.trained_model import load_chat_model

QUESTIONS = ["Repeat: tea", "What comes after f?", "Say hi", "Name a river.", "Count: 1 2", "ok?"]
NEW_TOKENS = 6


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 4-step run on answers of 24 words: the model answers with words (a tiny model trained
    on the demo's one-word answers answers with end-of-turn at once, and an untrained one
    repeats the newline before the answer)."""
    work = tmp_path_factory.mktemp("predict")
    rng = random.Random(0)
    words = "river stone tea island cloud bright green small quiet north road lamp".split()
    data = work / "train.jsonl"
    with data.open("w") as f:
        for i in range(32):
            answer = " ".join(rng.choice(words) for _ in range(24))
            turns = [
                {"role": "user", "content": f"Describe place {i}."},
                {"role": "assistant", "content": answer},
            ]
            f.write(json.dumps({"messages": turns}) + "\n")
    out = work / "run"
    raw = tiny_text_config(
        out, data={"train": str(data)}, training={"steps": 4, "lr": 1e-2, "micro_batch_size": 8}
    )
    run_tiny_training(raw)
    (out / "config.toml").write_text(dump_config(load_config_dict(raw)))  # as `run` writes it
    return out


@pytest.fixture()
def test_file(tmp_path: Path) -> Path:
    lines = [
        json.dumps(
            {
                "messages": [
                    {"role": "user", "content": q},
                    {"role": "assistant", "content": f"answer {i}"},
                ]
            }
        )
        for i, q in enumerate(QUESTIONS)
    ]
    lines.insert(2, "{not json")
    lines.append(json.dumps({"messages": [{"role": "user", "content": "no reference here"}]}))
    path = tmp_path / "test.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return path


def predict(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(["predict", *argv, f"--max-new-tokens={NEW_TOKENS}"])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def read(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_batched_predictions_equal_one_at_a_time_answers_in_input_order(
    run: Path, test_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "preds.jsonl"
    code, stdout, err = predict(
        capsys, str(run), "--data", str(test_file), "--out", str(out), "--batch-size", "3"
    )
    assert code == 0, err
    records = read(out)
    assert [r["index"] for r in records] == list(range(8))
    assert [r["source"] for r in records] == [f"{test_file}:{i + 1}" for i in range(8)]
    assert records[2]["error"].startswith("invalid_json: ") and "prediction" not in records[2]
    assert records[7]["reference"] is None and records[7]["prompt"] == "no reference here"
    chat = load_chat_model(run, get_plugin_host(), device="cpu")
    settings = GenerationSettings(max_new_tokens=NEW_TOKENS)
    usable = [r for r in records if "error" not in r]
    assert [r["prompt"] for r in usable] == [*QUESTIONS, "no reference here"]
    expected = [chat.answer([{"role": "user", "content": r["prompt"]}], settings) for r in usable]
    assert [r["prediction"] for r in usable] == expected
    assert any(expected)  # the model says something: the comparison is not of empty answers
    assert [r["reference"] for r in usable[:-1]] == [f"answer {i}" for i in range(6)]
    scores = TextScores.of((r["prediction"], r["reference"]) for r in usable[:-1])
    assert stdout.splitlines() == [
        f"wrote 8 predictions to {out} (1 errors)",
        scores.line(),
    ]


def test_a_left_padded_batch_gives_each_prompt_its_own_logits(run: Path) -> None:
    import torch

    from hyper_core.generation import _left_padded, build_prompt, prompt_conversation

    chat = load_chat_model(run, get_plugin_host(), device="cpu")
    questions = ["Hi", "What comes after the letter f in the alphabet?", "Name a river."]
    prompts = [
        build_prompt(
            chat.adapter, prompt_conversation([{"role": "user", "content": q}]), chat.assets
        )
        for q in questions
    ]
    lengths = [p.features.length for p in prompts]
    assert len(set(lengths)) == 3  # every row but the longest is padded
    batch = _left_padded(prompts, chat.assets.pad_token_id)
    assert batch["attention_mask"].sum(1).tolist() == lengths
    with torch.no_grad():
        together = chat.model(**batch).logits[:, -1]
        for row, prompt in enumerate(prompts):
            alone = chat.model(input_ids=prompt.features.input_ids[None]).logits[0, -1]
            torch.testing.assert_close(together[row], alone, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("where", ["checkpoints/step-4", "checkpoints/latest"])
def test_a_checkpoint_predicts_like_its_run_folder(
    run: Path, test_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], where: str
) -> None:
    outs = []
    for model in (run, run / where):
        outs.append(tmp_path / f"{len(outs)}.jsonl")
        code, _, err = predict(capsys, str(model), "--data", str(test_file), "--out", str(outs[-1]))
        assert code == 0, err
    assert read(outs[0]) == read(outs[1])


def test_parquet_test_file(
    run: Path, test_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = [
        json.loads(line) for line in test_file.read_text().splitlines() if "not json" not in line
    ]
    parquet = tmp_path / "test.parquet"
    pq.write_table(pa.Table.from_pylist(rows), parquet)
    out = tmp_path / "p.jsonl"
    code, _, err = predict(capsys, str(run), "--data", str(parquet), "--out", str(out))
    assert code == 0, err
    records = read(out)
    assert [r["source"] for r in records] == [f"{parquet}[{i}]" for i in range(7)]
    assert [r["prompt"] for r in records] == [*QUESTIONS, "no reference here"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--batch-size", "0"], "--batch-size: expected at least 1, got 0"),
        (["--data", "nope.jsonl"], "--data nope.jsonl: no such file"),
    ],
)
def test_bad_arguments_are_one_line_exit_2(
    run: Path,
    test_file: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    args: list[str],
    message: str,
) -> None:
    argv = [str(run), "--data", str(test_file), "--out", str(tmp_path / "o.jsonl"), *args]
    code, out, err = predict(capsys, *argv)
    assert code == 2 and out == ""
    assert err.splitlines() == [f"hyper-train: error: {message}"]


@pytest.mark.slow
def test_two_ranks_write_what_one_rank_writes(
    run: Path, test_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Batches of 1: the same forwards on either side (batching is compared above).
    common = ["--data", str(test_file), "--batch-size", "1", f"--max-new-tokens={NEW_TOKENS}"]
    one, two = tmp_path / "one.jsonl", tmp_path / "two.jsonl"
    assert main(["predict", str(run), *common, "--out", str(one)]) == 0
    stdout_one = capsys.readouterr().out
    proc = hyper_train(
        ["predict", str(run), *common, "--out", str(two), "--nproc-per-node", "2"],
        timeout=240,
        OMP_NUM_THREADS="1",
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert read(two) == read(one)
    assert proc.stdout.replace(str(two), str(one)) == stdout_one
    assert sorted(p.name for p in tmp_path.iterdir()) == ["one.jsonl", "test.jsonl", "two.jsonl"]
