"""The example adapter passes the conformance suite and learns from pixels on the bundled data."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from hyper_core.config import load_config
from hyper_core.testing import isolated_host
from hyper_core.testing.conformance_suite import AdapterConformance
from hyper_core.trainer.trainer import Trainer

HERE = Path(__file__).resolve().parents[1]
PLUGIN = "hyper_llava.plugin"


class TestLlavaConformance(AdapterConformance):
    adapter = "llava"
    plugins = (PLUGIN,)
    distributed = True


def test_config_json_finds_the_adapter() -> None:
    adapters = isolated_host([PLUGIN]).registries.model_adapters
    assert adapters.entry("LlavaForConditionalGeneration").name == "llava"


def _shuffled_images(samples: list[dict]) -> list[dict]:
    """The samples with their images permuted across samples."""
    parts = [p for s in samples for m in s["messages"] if isinstance(m["content"], list)
             for p in m["content"] if p.get("type") == "image"]  # fmt: skip
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
def test_the_demo_learns_colour_from_pixels(tmp_path: Path) -> None:
    host = isolated_host([PLUGIN])
    config = load_config(
        HERE / "llava_demo.toml",
        [f"--run.output_dir={tmp_path}", "--logging.progress=none"],
        host.registries.config_sections,
    )
    trainer = Trainer(config, host)
    trainer.train()
    assert trainer.last_eval["accuracy_colour"] >= 0.9, trainer.last_eval
    eval_set = trainer.dataloaders.eval.dataset
    eval_set.raw_samples = _shuffled_images(eval_set.raw_samples)
    control = trainer.evaluate()
    assert control["accuracy_colour"] <= 0.45, control  # chance ~1/6: the pixels matter
