"""The Gemma 3 shapes demo learns colours and shapes from pixels (the Qwen demo's bars); with
images shuffled across samples the same model falls to about chance."""

from __future__ import annotations

from pathlib import Path

import pytest

from hyper_core.config import load_config
from hyper_core.testing import isolated_host, read_metrics
from hyper_core.testing.vl import shuffled_images
from hyper_core.trainer.trainer import Trainer

DEMO = Path(__file__).resolve().parents[2] / "configs" / "gemma3_demo.toml"


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
    eval_set.raw_samples = shuffled_images(eval_set.raw_samples)
    control = trainer.evaluate()
    assert control["accuracy_colour"] <= 0.4, control  # chance ~1/6
    assert control["accuracy_shape"] <= 0.6, control  # chance ~1/3
