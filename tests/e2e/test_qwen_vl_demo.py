"""The README's demo: a tiny Qwen2.5-VL learns colours and shapes from pixels.

Held-out accuracy must pass the issue's bars, and with images shuffled across samples the same
model must fall to about chance — proof that the pixels reach the loss.
"""

from __future__ import annotations

import copy
import random
from pathlib import Path

import pytest

from hyper_core.config import load_config
from hyper_core.testing import isolated_host, read_metrics
from hyper_core.trainer.trainer import Trainer

REPO = Path(__file__).resolve().parents[2]
DEMO = REPO / "configs" / "qwen2_5_vl_demo.toml"


def shuffle_images(raw_samples: list[dict], seed: int = 0) -> list[dict]:
    """The same samples with their image paths permuted (a derangement-ish shuffle)."""
    samples = copy.deepcopy(list(raw_samples))
    parts = [
        part
        for s in samples
        for m in s["messages"]
        if isinstance(m["content"], list)
        for part in m["content"]
        if part.get("type") == "image"
    ]
    images = [p["image"] for p in parts]
    rng = random.Random(seed)
    shuffled = images[:]
    rng.shuffle(shuffled)
    for part, image in zip(parts, shuffled, strict=True):
        part["image"] = image
    return samples


@pytest.mark.slow
def test_demo_learns_from_pixels(tmp_path: Path) -> None:
    host = isolated_host(["hyper_qwen_vl.plugin"])
    config = load_config(
        DEMO,
        [f"--run.output_dir={tmp_path}", "--logging.progress=none"],
        host.registries.config_sections,
    )
    trainer = Trainer(config, host)
    trainer.train()
    final = trainer.last_eval
    assert final["accuracy_colour"] >= 0.95, final
    assert final["accuracy_shape"] >= 0.85, final
    logged = [m for m in read_metrics(tmp_path) if "loss" in m]
    assert logged[-1]["loss"] < 0.5 * logged[0]["loss"]

    eval_set = trainer.dataloaders.eval.dataset
    eval_set.raw_samples = shuffle_images(eval_set.raw_samples)
    control = trainer.evaluate()
    assert control["accuracy_colour"] <= 0.4, control  # chance ~1/6
    assert control["accuracy_shape"] <= 0.6, control  # chance ~1/3
