"""Preference training of the tiny Qwen2.5-VL on the shapes pairs: a pair's images are encoded
once and fed to both replies, with the same losses as encoding each sequence's own."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
from pref_helpers import PLUGIN

from hyper_core.testing import run_tiny_training
from hyper_preference.run import PreferenceRun


def vl_config(out: Path, **preference: Any) -> dict[str, Any]:
    """The tiny Qwen2.5-VL, DPO with a frozen copy on 8 shapes pairs, 2 steps of 4 pairs."""
    shapes = {"format": "shapes_pairs", "num_samples": 8, "image_size": 56, "seed": 3}
    return {
        "run": {"output_dir": str(out), "seed": 0},
        "model": {"adapter": "qwen2_5_vl", "config": "tiny", "attn_implementation": "varlen"},
        "data": {"train": shapes, "max_seq_len": 256, "batching": "packed"},
        "training": {
            "steps": 2,
            "global_batch_size": 4,
            "micro_batch_size": 2,
            "lr": 1e-3,
            "warmup_steps": 0,
        },
        "logging": {"every_steps": 1, "progress": "none"},
        "checkpoint": {"resume": "none", "save_final": False},
        "preference": {"loss": "sigmoid", "beta": 0.5, "reference": "copy", **preference},
    }


def _run(out: Path, **preference: Any) -> tuple[list[float], PreferenceRun]:
    run = run_tiny_training(vl_config(out, **preference), plugins=[PLUGIN, "hyper_qwen_vl.plugin"])
    (pref,) = [cb for cb in run.trainer.callbacks if isinstance(cb, PreferenceRun)]
    return run.losses, pref


def test_images_encoded_once_per_pair_give_the_same_losses(tmp_path: Path) -> None:
    once, shared = _run(tmp_path / "once")
    each, separate = _run(tmp_path / "each", encode_images_once=False)
    assert separate.shared_images is None
    images = shared.shared_images
    assert images is not None and images.encoded > 0
    # 2 steps x 4 pairs x 1 image, for the policy and for the frozen copy
    assert (images.encoded, images.received) == (16, 32)
    assert once[0] == pytest.approx(math.log(2), abs=1e-6)
    assert once == pytest.approx(each, abs=1e-5)
    assert abs(once[1] - math.log(2)) > 1e-4  # step 2 depends on step 1's gradients
