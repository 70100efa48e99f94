"""``moving_shapes`` (the video demo's clips) is a core dataset format: it needs no plugin."""

from __future__ import annotations

from pathlib import Path

from hyper_core.demo.moving_shapes import QUESTION, MovingShapesOptions
from hyper_core.testing import isolated_host


def test_the_core_registers_moving_shapes(tmp_path: Path) -> None:
    formats = isolated_host([]).registries.dataset_formats
    assert "moving_shapes" in formats
    load = formats.get("moving_shapes")
    assert formats.entry("moving_shapes").options_class() is MovingShapesOptions
    options = MovingShapesOptions(num_samples=2, image_size=16, num_frames=2)
    samples = load(str(tmp_path), options, None)
    assert len(samples) == 2
    assert samples[0]["messages"][0]["content"][1] == {"type": "text", "text": QUESTION}
