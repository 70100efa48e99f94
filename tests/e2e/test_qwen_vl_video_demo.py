"""The video demo (``configs/qwen2_5_vl_video_demo.toml``): a tiny Qwen2.5-VL learns which way
a shape moves from the frames' time order. Held-out accuracy is well above chance (1/4); the
same trained model on the same held-out clips with their frames listed in a random order
(``shuffled_frames``) is near chance, so the frames and their temporal positions reach the
loss. (Trained on shuffled clips, the demo stays at chance too: 0.240, measured by hand with
``--data.train.shuffled_frames=true --data.eval.shuffled_frames=true``; not run here, to keep
the suite's time.) Measured on 2 CPU cores: 0.870 in about 30 s, shuffled frames 0.250.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from hyper_core.config import load_config
from hyper_core.testing import isolated_host, read_metrics
from hyper_core.trainer.trainer import Trainer

REPO = Path(__file__).resolve().parents[2]
DEMO = REPO / "configs" / "qwen2_5_vl_video_demo.toml"


def train_demo(output_dir: Path, *overrides: str) -> dict:
    """Run the demo config with ``overrides``; its final eval metrics and first/last loss."""
    host = isolated_host(["hyper_qwen_vl.plugin"])
    config = load_config(
        DEMO,
        [f"--run.output_dir={output_dir}", "--logging.progress=none", *overrides],
        host.registries.config_sections,
    )
    trainer = Trainer(config, host)
    trainer.train()
    logged = [m for m in read_metrics(output_dir) if "loss" in m]
    return {**trainer.last_eval, "first_loss": logged[0]["loss"], "last_loss": logged[-1]["loss"]}


@pytest.mark.slow
def test_video_demo_learns_direction_from_the_frame_order(tmp_path: Path) -> None:
    final = train_demo(tmp_path)
    assert final["accuracy_direction"] >= 0.7, final  # measured 0.870; chance 0.25
    assert final["last_loss"] < 0.5 * final["first_loss"], final
    # The finished run again (it resumes at its end and only evaluates), on shuffled frames.
    control = train_demo(tmp_path, "--checkpoint.resume=auto", "--data.eval.shuffled_frames=true")
    assert control["accuracy_direction"] <= 0.4, control
