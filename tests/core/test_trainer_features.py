"""Trainer features: eval cadence, bf16, activation checkpointing, stop signals, logging."""

from __future__ import annotations

import os
import signal
import time
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


class SignalAtStep:
    def __init__(self, step: int, sig: signal.Signals = signal.SIGTERM) -> None:
        self.step = step
        self.sig = sig

    @hookimpl
    def on_step_end(self, state: Any) -> None:
        if state.global_step == self.step:
            os.kill(os.getpid(), self.sig)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP])
def test_a_stop_signal_stops_after_the_current_step_and_saves(
    sig: signal.Signals, tmp_path: Path
) -> None:
    rec = HookRecorder()
    before = signal.getsignal(sig)
    run = run_tiny_training(
        tiny_text_config(tmp_path, training={"steps": 10}), plugins=[rec, SignalAtStep(2, sig)]
    )
    assert run.trainer.state.global_step == 2
    assert "on_train_end" in rec.names
    assert (tmp_path / "checkpoints" / "step-2" / "COMPLETE").is_file()
    assert signal.getsignal(sig) is before  # handler restored


class SignalAgainWhileSaving:
    """A second SIGTERM, more than a second after the first, while the stop's checkpoint is
    being written."""

    @hookimpl
    def on_save_checkpoint(self, state: Any, plugin_state: dict[str, Any]) -> None:
        time.sleep(1.1)
        os.kill(os.getpid(), signal.SIGTERM)


def test_a_second_signal_forces_the_exit(tmp_path: Path) -> None:
    config = tiny_text_config(tmp_path, training={"steps": 10})
    with pytest.raises(KeyboardInterrupt):
        run_tiny_training(config, plugins=[SignalAtStep(2), SignalAgainWhileSaving()])
    assert not (tmp_path / "checkpoints" / "step-2").exists()
    assert not (tmp_path / "checkpoints" / "latest").exists()


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


def test_plot_draws_the_eval_curves(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import matplotlib.axes

    from hyper_core.cli import main
    from hyper_core.demo.text import ensure_text_demo
    from hyper_core.trainer.plot import eval_series, read_evals

    config = tiny_text_config(
        tmp_path,
        data={"eval": str(ensure_text_demo("eval")), "eval_samples": 8},
        training={"eval_every_steps": 2},
    )
    run_tiny_training(config, steps=4)
    evals = read_evals(tmp_path)
    assert [e["step"] for e in evals] == [2, 4]
    drawn: list[tuple[list[float], list[float], object]] = []
    plot = matplotlib.axes.Axes.plot

    def record(self: object, *args: object, **kwargs: object) -> object:
        drawn.append((list(args[0]), list(args[1]), kwargs.get("label")))  # type: ignore[call-overload]
        return plot(self, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(matplotlib.axes.Axes, "plot", record)
    assert main(["plot", str(tmp_path)]) == 0
    curves = {label: (x, y) for x, y, label in drawn}
    assert curves["eval"] == eval_series(evals, "eval_loss")
    assert curves["eval"][1] == [e["eval_loss"] for e in evals]
    assert curves["token_accuracy"] == ([2, 4], [e["token_accuracy"] for e in evals])


def test_the_console_eval_line_has_perplexity_and_token_accuracy() -> None:
    from hyper_core.trainer.progress import eval_line

    metrics = {
        "step": 40,
        "eval_loss": 1.25,
        "perplexity": 3.4903,
        "token_accuracy": 0.6125,
        "accuracy_colour": 0.5,
    }
    assert eval_line(metrics) == (
        "eval step 40: loss 1.2500  ppl 3.49  token_acc 0.613  accuracy: colour 0.500"
    )


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
