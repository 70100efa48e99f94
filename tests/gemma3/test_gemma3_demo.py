"""The Gemma 3 shapes demo learns colours and shapes from pixels (the Qwen demo's bars); with
images shuffled across samples the same model falls to about chance."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from hyper_core.config import load_config
from hyper_core.testing import isolated_host, read_metrics
from hyper_core.trainer.trainer import Trainer

DEMO = Path(__file__).resolve().parents[2] / "configs" / "gemma3_demo.toml"


def _shuffled_images(samples: list[dict]) -> list[dict]:
    """The samples with their image paths permuted across samples."""
    parts = [
        part
        for s in samples
        for m in s["messages"]
        if isinstance(m["content"], list)
        for part in m["content"]
        if part.get("type") == "image"
    ]
    images = [p["image"] for p in parts]
    random.Random(0).shuffle(images)
    out = []
    it = iter(images)
    for s in samples:
        messages = []
        for m in s["messages"]:
            content = m["content"]
            if isinstance(content, list):
                content = [
                    {**p, "image": next(it)} if p.get("type") == "image" else p for p in content
                ]
            messages.append({**m, "content": content})
        out.append({**s, "messages": messages})
    return out


@pytest.mark.slow
def test_the_demo_learns_from_pixels(tmp_path: Path) -> None:
    host = isolated_host(["hyper_gemma3.plugin"])
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
    eval_set.raw_samples = _shuffled_images(eval_set.raw_samples)
    control = trainer.evaluate()
    assert control["accuracy_colour"] <= 0.4, control  # chance ~1/6
    assert control["accuracy_shape"] <= 0.6, control  # chance ~1/3
