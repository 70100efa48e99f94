"""``hyper-train data stats`` counts videos and video tokens per sample, like images."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hyper_core.cli import main
from hyper_core.demo.moving_shapes import generate_moving_shapes

DEMO = Path(__file__).parents[2] / "configs" / "qwen2_5_vl_video_demo.toml"


def mixed_data(root: Path) -> Path:
    """3 demo clips (16 video tokens each), then a sample with one image and a text one."""
    data = generate_moving_shapes(root, num_samples=3, seed=0)
    lines = data.read_text().splitlines()
    frame = json.loads(lines[0])["messages"][0]["content"][0]["video"][0]
    for user in ([{"type": "image", "image": frame}, {"type": "text", "text": "What?"}], "Hi"):
        lines.append(json.dumps({"messages": [
            {"role": "user", "content": user}, {"role": "assistant", "content": "a shape"},
        ]}))  # fmt: skip
    data.write_text("\n".join(lines) + "\n")
    return data


def test_videos_and_video_tokens_are_counted(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["data", "stats", str(DEMO), f"--data.train={mixed_data(tmp_path)}"]
    assert main([*args, "--json"]) == 0
    per_sample = json.loads(capsys.readouterr().out)["per_sample"]
    # sorted per sample: videos [0, 0, 1, 1, 1], video tokens [0, 0, 16, 16, 16]
    assert per_sample["videos"] == {"min": 0, "median": 1, "p90": 1, "max": 1, "total": 3}
    assert per_sample["video_tokens"] == {"min": 0, "median": 16, "p90": 16, "max": 16, "total": 48}
    assert per_sample["images"]["total"] == 1 and per_sample["image_tokens"]["total"] > 0
    assert main(args) == 0
    lines = capsys.readouterr().out.splitlines()
    assert "  video_tokens      0      16      16      16        48" in lines
    assert "  videos            0       1       1       1         3" in lines
