"""The memory estimate of a Gemma 3 run (fixed-size SigLIP tower, four norms per decoder layer,
a rotary table per layer type) equals its measured state and its activations within 25 %."""

from __future__ import annotations

import json
from typing import Any

import pytest
from mp_helpers import PROFILER_ON, run_in_process, write_config

GEMMA3_TINY = 'adapter = "gemma3"\nconfig = "tiny"\nattn_implementation = "varlen"\n'


@pytest.fixture(scope="module")
def profiled(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("gemma3")
    config = write_config(root / "gemma3.toml", root / "out", extra=PROFILER_ON, model=GEMMA3_TINY)
    trainer = run_in_process(config)
    summary = json.loads((root / "out" / "memory" / "summary.json").read_text())
    return {"config": config, "summary": summary, "trainer": trainer}


def test_state_is_exact_and_activations_within_a_quarter(profiled: dict[str, Any]) -> None:
    comp = profiled["summary"]["comparison"]
    for key in ("params", "grads", "optimizer", "buffers"):
        assert comp[key]["measured"] == comp[key]["estimate"], key
    assert comp["activations"]["ratio"] == pytest.approx(1.0, abs=0.25)


def test_the_fixed_size_tower_counts_its_patches(profiled: dict[str, Any]) -> None:
    """Every image is resized to the tower's 64 px in 8 px patches: 64 patches each, counted
    from ``pixel_values`` (no ``image_grid_thw``), and the tower's blocks are in the estimate."""
    estimate = profiled["summary"]["estimate"]
    batch = estimate["batch"]
    assert batch["images"] > 0
    assert batch["patches"] == batch["images"] * 64
    assert estimate["activations"]["vision_blocks"] > 0
    assert "vision_rope" not in estimate["activations"]  # SigLIP has a learned position table


def test_the_estimate_command_sizes_a_fixed_size_tower(
    profiled: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    """Without a micro-batch, `memory estimate` gives each sample one image of the tower's
    size, not a `max_pixels` guess."""
    from hyper_core.cli import main

    capsys.readouterr()
    assert main(["memory", "estimate", str(profiled["config"]), "--json"]) == 0
    batch = json.loads(capsys.readouterr().out)["batch"]
    assert batch["images"] == 2  # micro_batch_size
    assert batch["patches"] == 2 * 64


def test_decoder_shape_sees_gemma_norms_and_rope_tables(profiled: dict[str, Any]) -> None:
    from hyper_memory_profiler.estimate import model_shape

    trainer = profiled["trainer"]
    shape = model_shape(trainer.model, trainer.adapter, "varlen")
    assert shape.text.extra_norms == 2  # post-attention and post-feedforward norms
    assert shape.rope_tables == 2  # sliding and full attention layers
    assert shape.vision is not None and shape.vision.norm == "layer"
    assert not shape.vision_rope
