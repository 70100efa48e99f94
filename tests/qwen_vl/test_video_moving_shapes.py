"""The ``moving_shapes`` video demo data: clips that only the frames' time order explains, the
shuffled-frames control, the format's options and the demo config."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from qwen_vl_helpers import ADAPTERS

from hyper_core.cli import main
from hyper_core.config import load_config
from hyper_core.config.fields import format_options
from hyper_core.demo.moving_shapes import (
    DIRECTIONS,
    QUESTION,
    MovingShapesOptions,
    generate_moving_shapes,
    load_moving_shapes_format,
)
from hyper_core.errors import ConfigError

DEMO = Path(__file__).parents[2] / "configs" / "qwen2_5_vl_video_demo.toml"


def position(frame: Path) -> tuple[float, float]:
    """The shape's centroid ``(x, y)``: the pixels unlike the background's corner pixel."""
    pixels = np.asarray(Image.open(frame).convert("RGB")).astype(int)
    ys, xs = np.nonzero(np.abs(pixels - pixels[-1, -1]).sum(-1) > 30)
    return float(xs.mean()), float(ys.mean())


def rows(data: Path) -> list[dict]:
    return [json.loads(line) for line in data.read_text().splitlines()]


def test_clips_move_the_way_the_answer_says(tmp_path: Path) -> None:
    data = generate_moving_shapes(tmp_path, num_samples=12, image_size=40, num_frames=6, seed=3)
    samples = rows(data)
    assert {s["meta"]["direction"] for s in samples} == set(DIRECTIONS)
    for s in samples:
        video, text = s["messages"][0]["content"]
        assert text == {"type": "text", "text": QUESTION}
        assert s["messages"][1]["content"] == s["meta"]["answer"] == s["meta"]["direction"]
        xs, ys = zip(*(position(tmp_path / f) for f in video["video"]), strict=True)
        dx, dy = DIRECTIONS[s["meta"]["direction"]]
        along, across = (xs, ys) if dx else (ys, xs)
        steps = np.diff(along) * (dx + dy)
        assert (steps > 0).all(), (s["meta"], along)  # monotonic along the direction
        # the other axis visits the same offsets: unordered, the frames show no axis
        assert sorted(np.round(np.subtract(along, min(along)))) == sorted(
            np.round(np.subtract(across, min(across)))
        )


def test_shuffled_frames_list_the_same_clips_out_of_order(tmp_path: Path) -> None:
    args = {"num_samples": 10, "image_size": 32, "num_frames": 6, "seed": 0}
    ordered = rows(generate_moving_shapes(tmp_path / "a", **args))
    shuffled = rows(generate_moving_shapes(tmp_path / "b", shuffled_frames=True, **args))
    moved = 0
    for a, b in zip(ordered, shuffled, strict=True):
        assert a["meta"] == b["meta"]
        frames_a = a["messages"][0]["content"][0]["video"]
        frames_b = b["messages"][0]["content"][0]["video"]
        assert sorted(frames_a) == sorted(frames_b)
        for name in frames_a:
            assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()
        moved += frames_a != frames_b
    assert moved >= 8


def test_format_options_and_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HYPER_TRAIN_CACHE", str(tmp_path))
    options = MovingShapesOptions(num_samples=3, image_size=24, num_frames=4, split="eval")
    first = load_moving_shapes_format(None, options)
    again = load_moving_shapes_format(None, options)
    assert len(first) == 3 and [s["meta"] for s in first] == [s["meta"] for s in again]
    assert len(list((tmp_path / "moving_shapes").iterdir())) == 2  # the set and its lock
    with pytest.raises(ConfigError, match=r"\$\.data\.train\.num_frames"):
        format_options(MovingShapesOptions, {"num_frames": 1}, "$.data.train")


def test_demo_config_validates_and_a_clip_is_8_tokens(tmp_path: Path, capsys) -> None:
    assert main(["config", "validate", str(DEMO)]) == 0
    assert capsys.readouterr().out.strip().endswith(": ok")
    config = load_config(DEMO)
    adapter = ADAPTERS[config.model.adapter]()
    assets = adapter.build_assets(config.model)
    frames = config.data.train.options["num_frames"]
    (sample,) = rows(generate_moving_shapes(tmp_path, num_samples=1, num_frames=frames, seed=0))
    sample["_source"] = {"file": str(tmp_path / "data.jsonl"), "line": 1}
    feat = adapter.transform(sample, assets, max_seq_len=128)
    assert feat.media["video_grid_thw"].tolist() == [[2, 4, 4]]  # 4 frames of 56²
    assert int((feat.token_fields["mm_token_type_ids"] == 2).sum()) == 8
