"""``hyper-train data show``: one sample as the model sees it, trained tokens marked, images as
their token counts, and one-line errors for a bad pick."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hyper_core.batching.types import IGNORE_INDEX
from hyper_core.cli import main
from hyper_core.config import load_config
from hyper_core.data.show import ShownSample, segments
from hyper_core.plugins import get_plugin_host
from hyper_core.resolve import resolve_adapter

REPO = Path(__file__).resolve().parents[2]
CONFIG = str(REPO / "configs" / "text_demo.toml")

MULTI_TURN = {
    "messages": [
        {"role": "user", "content": "Name a colour."},
        {"role": "assistant", "content": "teal"},
        {"role": "user", "content": "Another one?"},
        {"role": "assistant", "content": "amber"},
    ]
}


def write(path: Path, samples: list[object]) -> Path:
    path.write_text("".join((s if isinstance(s, str) else json.dumps(s)) + "\n" for s in samples))
    return path


def single(question: str, answer: str) -> dict[str, object]:
    return {
        "messages": [
            {"role": "user", "content": question},
            {"role": "assistant", "content": answer},
        ]
    }


def show(capsys: pytest.CaptureFixture[str], data: Path, *args: str) -> tuple[int, str, str]:
    code = main(["data", "show", CONFIG, f"--data.train={data}", *args])
    out, err = capsys.readouterr()
    return code, out, err


def test_multi_turn_marks_each_answer_and_counts_as_the_transform(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = write(tmp_path / "t.jsonl", [single("Hi", "yo"), MULTI_TURN])
    code, out, err = show(capsys, data, "--index", "1")
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0] == f"train sample 1 of 2: {data}:2"
    # Both answers and their end-of-turn tokens are trained; no question is.
    assert "[[teal<|im_end|>]]" in out and "[[amber<|im_end|>]]" in out
    body = out.split("\n\n", 1)[1]
    assert "[[" not in body.split("Name a colour.")[0]
    assert "Another one?<|im_end|>" in out and "[[Another" not in out

    config = load_config(CONFIG, ())
    adapter = resolve_adapter(config.model, get_plugin_host().registries)
    assets = adapter.build_assets(config.model)
    features = adapter.transform(MULTI_TURN, assets=assets, max_seq_len=256)
    assert lines[1] == f"{features.length} tokens, {features.num_loss_tokens} trained (loss)"

    code, out, err = show(capsys, data, "--index", "1", "--json")
    assert code == 0, err
    report = json.loads(out)
    assert report["tokens"] == features.length
    assert report["loss_tokens"] == features.num_loss_tokens
    text = "".join(s["text"] for s in report["segments"])
    assert text == assets.tokenizer.decode(features.input_ids.tolist())
    trained = [s["text"] for s in report["segments"] if s["loss"]]
    assert trained == ["teal<|im_end|>", "amber<|im_end|>"]


def test_where_picks_the_first_sample_with_the_text(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = write(tmp_path / "t.jsonl", [single("a", "b"), single("find the otter", "ok")] * 2)
    code, out, err = show(capsys, data, "--where", "otter", "--json")
    assert code == 0, err
    assert json.loads(out)["index"] == 1
    assert json.loads(out)["source"] == f"{data}:2"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--index", "5"], "--index 5: out of range, the train data has 2 samples (0..1)"),
        (["--index", "-1"], "--index -1: out of range, the train data has 2 samples (0..1)"),
        (["--where", "zebra"], "--where 'zebra': no train sample of 2 has it"),
    ],
)
def test_a_bad_pick_is_one_line_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str], message: str
) -> None:
    data = write(tmp_path / "t.jsonl", [single("a", "b"), single("c", "d")])
    code, out, err = show(capsys, data, *args)
    assert code == 2
    assert out == ""
    assert err.splitlines() == [f"hyper-train: error: {message}"]


def test_split_eval_reads_the_eval_data(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    train = write(tmp_path / "t.jsonl", [single("a", "b")])
    held_out = write(tmp_path / "e.jsonl", [single("c", "d"), single("held out", "yes")])
    code, out, err = show(capsys, train, f"--data.eval={held_out}", "--split", "eval", "--index=1")
    assert code == 0, err
    assert out.splitlines()[0] == f"eval sample 1 of 2: {held_out}:2"
    assert "held out" in out


def test_a_skipped_sample_says_why(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = write(tmp_path / "t.jsonl", [single("a", "b"), "{not json"])
    code, out, err = show(capsys, data, "--index", "1")
    assert code == 2 and out == ""
    assert err.startswith(f"hyper-train: error: train sample 1 ({data}:2) is skipped in training")
    assert "invalid_json" in err


def test_image_tokens_collapse_to_one_placeholder_with_their_count() -> None:
    # ids: text 1 2, image pad 9 x4 between 7/8 markers, trained answer 3 4; labels shifted.
    ids = [1, 2, 7, 9, 9, 9, 9, 8, 5, 3, 4]
    trained = [False] * 9 + [True, True]
    labels = [ids[i + 1] if trained[i + 1] else IGNORE_INDEX for i in range(len(ids) - 1)]
    labels.append(IGNORE_INDEX)
    segs = segments(ids, labels, lambda run: "".join(f"<{t}>" for t in run), image_token_id=9)
    assert [(s.kind, s.tokens, s.loss) for s in segs] == [
        ("text", 3, False),
        ("image", 4, False),
        ("text", 2, False),
        ("text", 2, True),
    ]
    shown = ShownSample(index=0, split="train", total=1, source="f:1", segments=tuple(segs))
    plain = shown.render(colour=False)
    assert plain.splitlines()[1] == "11 tokens, 2 trained (loss), 1 image(s) of 4 tokens"
    assert plain.endswith("<1><2><7><image 0: 4 tokens><8><5>[[<3><4>]]")
    coloured = shown.render(colour=True)
    assert "\x1b[1;32m<3><4>\x1b[0m" in coloured and "[[" not in coloured
