"""Non-finite loss or gradients: the update is skipped and counted; ``max_bad_steps`` in a row
stop the run (exit 1) without saving, pruning or exporting."""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from hyper_core import hookimpl
from hyper_core.cli import main
from hyper_core.config import dump_config, load_config_dict
from hyper_core.testing import read_metrics, run_tiny_training, tiny_text_config
from hyper_core.trainer.trainer import TrainingDiverged


def weights(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def all_finite(tensors: dict[str, torch.Tensor]) -> bool:
    return all(bool(torch.isfinite(t).all()) for t in tensors.values())


def checkpoint_weights(checkpoint: Path, scratch: Path) -> dict[str, torch.Tensor]:
    """The model weights a DCP checkpoint folder holds."""
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    dcp_to_torch_save(checkpoint, scratch)
    return torch.load(scratch, weights_only=True)["model"]


class Poison:
    """Makes step ``at`` non-finite: ``how="loss"`` multiplies its loss by NaN (loss and
    gradients), ``how="grad"`` sets one gradient to inf (the loss stays finite). Records the
    weights after every step; requests a stop after step ``stop_at``."""

    def __init__(self, at: int, how: str = "loss", stop_at: int | None = None) -> None:
        self.at, self.how, self.stop_at = at, how, stop_at
        self.weights: dict[int, dict[str, torch.Tensor]] = {}

    @hookimpl
    def on_train_begin(self, trainer: Any) -> None:
        loss_fn: Callable[..., Any] = trainer.loss_fn

        def poisoned(*args: Any) -> Any:
            loss, parts = loss_fn(*args)
            if self.how == "loss" and trainer.state.global_step + 1 == self.at:
                loss = loss * float("nan")
            return loss, parts

        trainer.loss_fn = poisoned

    @hookimpl
    def on_micro_step_end(self, trainer: Any, state: Any) -> None:
        if self.how == "grad" and state.global_step + 1 == self.at:
            next(p for p in trainer.model.parameters() if p.grad is not None).grad.fill_(math.inf)

    @hookimpl
    def on_step_end(self, trainer: Any, state: Any) -> None:
        self.weights[state.global_step] = weights(trainer.unwrapped_model)
        if state.global_step == self.stop_at:
            state.stop_requested = True


def diverging_config(out: Path, **training: Any) -> dict[str, Any]:
    """The issue's reproduction, scaled down: lr 1e10 without warmup, a checkpoint every 2
    steps, keeping one, exporting at the end."""
    return tiny_text_config(
        out,
        training={"steps": 10, "lr": 1e10, **training},
        checkpoint={"every_steps": 2, "keep_last": 1, "export_hf": True},
    )


def test_divergence_stops_without_saving_pruning_or_exporting(tmp_path: Path) -> None:
    out = tmp_path / "run"
    plugin = Poison(at=0)  # only records weights
    with pytest.raises(TrainingDiverged, match="3 steps in a row") as info:
        run_tiny_training(diverging_config(out, max_bad_steps=3), plugins=[plugin])
    stopped_at = max(plugin.weights)
    assert stopped_at < 10
    assert f"stopped at step {stopped_at} without saving" in str(info.value)
    # No update was applied on the bad steps: the weights are those of the last good step.
    last_good = stopped_at - 3
    assert all_finite(plugin.weights[stopped_at])
    for k, w in plugin.weights[last_good].items():
        assert torch.equal(w, plugin.weights[stopped_at][k]), k
    metrics = read_metrics(out)
    assert metrics[-1]["step"] == stopped_at and metrics[-1]["bad_steps"] == 3
    assert metrics[-1]["loss"] == "nan"
    # The stop saved, pruned and exported nothing: latest is a checkpoint of finite weights.
    root = out / "checkpoints"
    latest = root / (root / "latest").read_text().strip()
    saved = sorted(p.name for p in root.glob("step-*"))
    assert saved == [latest.name] and int(latest.name.removeprefix("step-")) < stopped_at
    assert all_finite(checkpoint_weights(latest, tmp_path / "latest.pt"))
    assert not (out / "hf").exists()


def test_a_bad_step_is_skipped_and_training_goes_on(tmp_path: Path) -> None:
    plugin = Poison(at=3)
    run = run_tiny_training(tiny_text_config(tmp_path, training={"steps": 5}), plugins=[plugin])
    state = run.trainer.state
    assert (state.global_step, state.bad_steps, state.bad_streak) == (5, 1, 0)
    for k, w in plugin.weights[2].items():
        assert torch.equal(w, plugin.weights[3][k]), k
    assert not torch.equal(plugin.weights[3]["lm_head.weight"], plugin.weights[4]["lm_head.weight"])
    assert all_finite(plugin.weights[5])
    # Adam stepped 4 times; the LR schedule advanced on all 5 steps.
    adam_steps = {int(s["step"]) for s in run.trainer.optimizer.state.values()}
    assert adam_steps == {4}
    assert run.trainer.lr_scheduler.last_epoch == 5
    by_step = {m["step"]: m for m in run.metrics}
    assert by_step[3]["loss"] == "nan" and by_step[3]["bad_steps"] == 1
    assert "bad_steps" not in by_step[2] and math.isfinite(by_step[4]["loss"])


def test_an_infinite_gradient_alone_skips_the_update(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    plugin = Poison(at=2, how="grad")
    with caplog.at_level("WARNING", logger="hyper_train"):
        run = run_tiny_training(tiny_text_config(tmp_path), plugins=[plugin], steps=3)
    assert run.trainer.state.bad_steps == 1
    assert math.isfinite(run.metrics[1]["loss"]) and run.metrics[1]["grad_norm"] == "inf"
    for k, w in plugin.weights[1].items():
        assert torch.equal(w, plugin.weights[2][k]), k
    assert "step 2: non-finite grad norm (inf); update skipped (1 in a row" in caplog.text


def test_resume_after_a_bad_step_is_bit_identical(tmp_path: Path) -> None:
    def config(out: Path) -> dict[str, Any]:
        return tiny_text_config(out, training={"steps": 6}, checkpoint={"resume": "auto"})

    straight = run_tiny_training(config(tmp_path / "a"), plugins=[Poison(at=3)])
    # Stopped right after the bad step (saved there), then resumed.
    run_tiny_training(config(tmp_path / "b"), plugins=[Poison(at=3, stop_at=3)])
    assert (tmp_path / "b" / "checkpoints" / "latest").read_text() == "step-3"
    resumed = run_tiny_training(config(tmp_path / "b"), plugins=[Poison(at=3)])
    assert resumed.trainer.state.bad_steps == straight.trainer.state.bad_steps == 1
    wa = weights(straight.trainer.unwrapped_model)
    wb = weights(resumed.trainer.unwrapped_model)
    for k in wa:
        assert torch.equal(wa[k], wb[k]), k


def test_the_cli_reports_divergence_in_one_line_and_exits_1(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    toml = tmp_path / "diverge.toml"
    toml.write_text(dump_config(load_config_dict(diverging_config(tmp_path / "run"))))
    assert main(["run", str(toml)]) == 1
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("hyper-train: error:")]
    assert len(lines) == 1 and "training diverged: 5 steps in a row" in lines[0]
    assert "Traceback" not in err
