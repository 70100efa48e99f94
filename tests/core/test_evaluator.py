"""Evaluation is a build stage (``build_evaluator``) that uses the run's ``loss_fn``; the
checkpointer saves the objects ``build_checkpointer`` gave it."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import attrs
import pytest
import torch

from hyper_core.checkpoint import Checkpointer, read_extra_state
from hyper_core.demo.text import ensure_text_demo
from hyper_core.hookspecs import hookimpl
from hyper_core.step.loss import causal_lm_loss
from hyper_core.step.optim import build_adamw, build_scheduler
from hyper_core.testing import (
    TinyRun,
    run_tiny_training,
    tiny_text_config,
)


class DoubleLoss:
    """A plugin whose loss is twice the causal-LM loss."""

    @hookimpl
    def build_loss(self, config: Any, adapter: Any) -> Any:
        def loss_fn(outputs: Any, loss_inputs: Any, num_loss_tokens: float) -> Any:
            loss, parts = causal_lm_loss(outputs, loss_inputs, num_loss_tokens)
            return 2 * loss, parts

        return loss_fn


class BestLoss:
    """A plugin that wraps the default evaluator (the ``build_evaluator`` example)."""

    @hookimpl(wrapper=True)
    def build_evaluator(self, config: Any, dist: Any) -> Any:
        evaluator = yield

        class WithBestLoss:
            best = float("inf")

            def evaluate(self) -> dict[str, Any]:
                metrics = evaluator.evaluate()
                self.best = min(self.best, metrics["eval_loss"])
                metrics["best_eval_loss"] = self.best
                return metrics

        return WithBestLoss()


def eval_run(output_dir: Path, plugins: list[Any]) -> TinyRun:
    config = tiny_text_config(
        output_dir,
        data={"eval": str(ensure_text_demo("eval")), "eval_samples": 8},
        training={"eval_every_steps": 1},
    )
    return run_tiny_training(config, plugins=plugins, steps=2)


def hand_eval_loss(run: TinyRun) -> float:
    """Token-mean cross-entropy of the trained model over the eval set."""
    model = run.trainer.unwrapped_model
    model.eval()
    loss_sum, tokens = 0.0, 0
    with torch.no_grad():
        for i in range(len(run.trainer.datasets.eval)):
            features = run.trainer.datasets.eval[i]
            logits = model(input_ids=features.input_ids[None]).logits[0]
            mask = features.labels != -100
            loss_sum += float(
                torch.nn.functional.cross_entropy(
                    logits[mask].float(), features.labels[mask], reduction="sum"
                )
            )
            tokens += int(mask.sum())
    return loss_sum / tokens


def test_a_plugins_loss_is_the_eval_loss(tmp_path: Path) -> None:
    run = eval_run(tmp_path, [DoubleLoss()])
    assert run.trainer.last_eval["eval_loss"] == pytest.approx(2 * hand_eval_loss(run), rel=1e-4)


def test_a_plugin_wraps_the_evaluator(tmp_path: Path) -> None:
    run = eval_run(tmp_path, [BestLoss()])
    evals = run.eval_metrics
    assert [e["step"] for e in evals] == [1, 2]
    losses = [e["eval_loss"] for e in evals]
    assert [e["best_eval_loss"] for e in evals] == [losses[0], min(losses)]
    assert evals[-1]["eval_loss"] == pytest.approx(hand_eval_loss(run), rel=1e-4)


@pytest.mark.filterwarnings("ignore:Detected call of `lr_scheduler.step")
def test_the_checkpointer_saves_the_objects_it_was_built_with(tmp_path: Path) -> None:
    run = run_tiny_training(tiny_text_config(tmp_path / "run"), steps=1)
    trainer = run.trainer
    other = copy.deepcopy(trainer.model)
    with torch.no_grad():
        for p in other.parameters():
            p.fill_(0.25)
    optimizer = build_adamw(other, trainer.config.training)
    scheduler = build_scheduler(optimizer, trainer.config.training, 100)
    for _ in range(7):
        scheduler.step()
    run_section = attrs.evolve(trainer.config.run, output_dir=str(tmp_path / "other"))
    config = attrs.evolve(trainer.config, run=run_section)
    checkpointer = Checkpointer(
        config,
        trainer.dist,
        model=other,
        optimizer=optimizer,
        lr_scheduler=scheduler,
        dataloaders=trainer.dataloaders,
    )
    path = checkpointer.save(trainer)
    assert read_extra_state(path, 0)["lr_scheduler"]["last_epoch"] == 7

    restored = copy.deepcopy(trainer.model)
    restored_optimizer = build_adamw(restored, trainer.config.training)
    restored_scheduler = build_scheduler(restored_optimizer, trainer.config.training, 100)
    reader = Checkpointer(
        config,
        trainer.dist,
        model=restored,
        optimizer=restored_optimizer,
        lr_scheduler=restored_scheduler,
        dataloaders=trainer.dataloaders,
    )
    reader.load(trainer, path)
    assert restored_scheduler.last_epoch == 7
    for (name, saved), trained in zip(
        restored.state_dict().items(), trainer.model.state_dict().values(), strict=True
    ):
        assert torch.equal(saved, torch.full_like(saved, 0.25)), name
        assert not torch.equal(saved, trained), name
