"""``data show`` and ``data stats`` on image data: each image as its expanded token count, and a
missing image's resolved path in the bad-sample example."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hyper_core.cli import main
from hyper_core.testing.vl import write_test_images

DEMO = Path(__file__).parents[2] / "configs" / "qwen2_5_vl_demo.toml"


def sample(images: list[str], question: str) -> str:
    user = [*({"type": "image", "image": name} for name in images)]
    user.append({"type": "text", "text": question})
    turns = [{"role": "user", "content": user}, {"role": "assistant", "content": "shapes"}]
    return json.dumps({"messages": turns})


def test_each_image_is_shown_as_its_token_count(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    write_test_images(tmp_path / "images")
    data = tmp_path / "train.jsonl"
    lines = [
        sample(["images/square.png", "images/wide.png"], "Compare them."),
        sample(["images/gone.png"], "What is it?"),
    ]
    data.write_text("\n".join(lines) + "\n")
    args = ["data", "show", str(DEMO), f"--data.train={data}", "--index", "0"]
    assert main([*args, "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    # The same counts as data stats gives the sample (the processor's expansion of each).
    assert main(["data", "stats", str(DEMO), f"--data.train={data}", "--json"]) == 0
    stats = json.loads(capsys.readouterr().out)
    image_tokens = report["image_tokens"]
    assert len(image_tokens) == 2 and image_tokens[0] != image_tokens[1]  # 112² vs 40 × 150
    assert sum(image_tokens) == stats["per_sample"]["image_tokens"]["total"]
    assert report["tokens"] == stats["per_sample"]["tokens"]["total"]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[1] == (
        f"{report['tokens']} tokens, {report['loss_tokens']} trained (loss), 2 image(s) of "
        f"{sum(image_tokens)} tokens"
    )
    assert (
        f"<|vision_start|><image 0: {image_tokens[0]} tokens><|vision_end|>"
        f"<|vision_start|><image 1: {image_tokens[1]} tokens><|vision_end|>Compare them."
    ) in out
    # The missing image of sample 1: its resolved path, in data stats and in data show.
    assert stats["bad"]["missing_image"]["example"] == (
        f"{data}:2: image not found: {tmp_path / 'images' / 'gone.png'}"
    )
    assert main([*args[:-1], "1"]) == 2
    assert f"image not found: {tmp_path / 'images' / 'gone.png'}" in capsys.readouterr().err
