"""Trainer features: eval cadence, bf16, activation checkpointing, stop signals, logging."""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

import pytest

from hyper_core import hookimpl
from hyper_core.demo.text import ensure_text_demo
from hyper_core.errors import UserError
from hyper_core.parallel.checkpointing import unit_policy
from hyper_core.testing import HookRecorder, run_tiny_training, tiny_text_config

EVAL = str(ensure_text_demo("eval"))


def test_eval_runs_every_n_steps_and_at_the_end(tmp_path: Path) -> None:
    cfg = tiny_text_config(
        tmp_path,
        training={"steps": 4, "eval_every_steps": 2},
        data={"eval": EVAL, "eval_samples": 8},
    )
    run = run_tiny_training(cfg)
    evals = run.eval_metrics
    assert [e["step"] for e in evals] == [2, 4]
    for e in evals:
        assert e["eval_tokens"] > 0 and e["eval_loss"] > 0
        assert 0.0 <= e["accuracy_all"] <= 1.0 and e["count_all"] == 8


def test_activation_checkpointing_does_not_change_the_loss(tmp_path: Path) -> None:
    base = run_tiny_training(tiny_text_config(tmp_path / "a"), steps=3)
    ac = run_tiny_training(
        tiny_text_config(tmp_path / "b", training={"activation_checkpointing": True}), steps=3
    )
    assert ac.losses == pytest.approx(base.losses, abs=1e-6)
    layers = [m for n, m in ac.trainer.unwrapped_model.named_modules() if n.endswith("layers.0")]
    assert layers and unit_policy(layers[0]) == "full"  # `true` still means full


def test_bf16_autocast_trains(tmp_path: Path) -> None:
    fp32 = run_tiny_training(tiny_text_config(tmp_path / "a"), steps=3)
    bf16 = run_tiny_training(
        tiny_text_config(tmp_path / "b", training={"mixed_precision": "bf16"}), steps=3
    )
    assert all(abs(a - b) < 0.1 for a, b in zip(fp32.losses, bf16.losses, strict=True))
    assert bf16.losses != fp32.losses  # autocast really ran in bf16


class SigtermAtStep:
    def __init__(self, step: int) -> None:
        self.step = step

    @hookimpl
    def on_step_end(self, state: Any) -> None:
        if state.global_step == self.step:
            os.kill(os.getpid(), signal.SIGTERM)


def test_sigterm_stops_after_the_current_step_and_saves(tmp_path: Path) -> None:
    rec = HookRecorder()
    run = run_tiny_training(
        tiny_text_config(tmp_path, training={"steps": 10}), plugins=[rec, SigtermAtStep(2)]
    )
    assert run.trainer.state.global_step == 2
    assert "on_train_end" in rec.names
    assert (tmp_path / "checkpoints" / "step-2" / "COMPLETE").is_file()
    assert signal.getsignal(signal.SIGTERM) is not None  # handler restored


def test_deterministic_runs_are_identical(tmp_path: Path) -> None:
    a = run_tiny_training(tiny_text_config(tmp_path / "a", run={"deterministic": True}), steps=3)
    b = run_tiny_training(tiny_text_config(tmp_path / "b", run={"deterministic": True}), steps=3)
    assert a.losses == b.losses


def test_tensorboard_without_the_extra_is_a_clear_error(tmp_path: Path) -> None:
    try:
        import tensorboard  # noqa: F401
    except ImportError:
        with pytest.raises(
            UserError, match=r"\$\.logging\.tensorboard.*hyper-train\[tensorboard\]"
        ):
            run_tiny_training(tiny_text_config(tmp_path, logging={"tensorboard": True}), steps=1)
    else:
        run_tiny_training(tiny_text_config(tmp_path, logging={"tensorboard": True}), steps=1)
        assert any((tmp_path / "tensorboard").iterdir())


def test_plot_draws_a_png(tmp_path: Path) -> None:
    from hyper_core.cli import main

    run_tiny_training(tiny_text_config(tmp_path), steps=3)
    assert main(["plot", str(tmp_path)]) == 0
    png = tmp_path / "metrics.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_trace_hooks_logs_every_hook_call(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    from hyper_core.cli import main

    repo = Path(__file__).resolve().parents[2]
    with caplog.at_level("INFO", logger="hyper_train.hooks"):
        code = main(
            [
                "run",
                str(repo / "configs" / "text_demo.toml"),
                "--trace-hooks",
                f"--run.output_dir={tmp_path}",
                "--training.steps=1",
                "--logging.progress=none",
            ]
        )
    assert code == 0
    text = caplog.text
    assert "hook build_model [" in text and "hyper_core.builtin.stages" in text
    assert "hook on_step_end" in text and " ms" in text
