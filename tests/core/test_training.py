"""Training math through the trainer: loss falls, packed = padded, accumulation = one batch."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
import torch

from hyper_core.testing import run_tiny_training, tiny_text_config


def final_weights(run) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in run.trainer.unwrapped_model.state_dict().items()}


def test_tiny_causal_lm_loss_falls(tmp_path: Path) -> None:
    run = run_tiny_training(
        tiny_text_config(
            tmp_path,
            training={"steps": 30, "lr": 3e-3, "warmup_steps": 5},
            logging={"every_steps": 1},
        ),
    )
    losses = run.losses
    assert len(losses) == 30
    assert sum(losses[-5:]) / 5 < 0.75 * sum(losses[:5]) / 5
    assert all(torch.isfinite(torch.tensor(losses)))


def test_packed_and_padded_batching_give_the_same_training(tmp_path: Path) -> None:
    runs = {
        b: run_tiny_training(tiny_text_config(tmp_path / b, data={"batching": b}), steps=4)
        for b in ("packed", "padded")
    }
    assert runs["packed"].losses == pytest.approx(runs["padded"].losses, abs=1e-5)
    # Adam divides by sqrt(v): float rounding of the two layouts shows up at ~1e-5 in weights.
    wa, wb = final_weights(runs["packed"]), final_weights(runs["padded"])
    for k in wa:
        torch.testing.assert_close(wa[k], wb[k], atol=5e-5, rtol=0)
    padded = [m["padding_ratio"] for m in runs["padded"].metrics if "padding_ratio" in m]
    packed = [m["padding_ratio"] for m in runs["packed"].metrics if "padding_ratio" in m]
    assert max(packed) == 0.0 and min(padded) > 0.0


def test_gradient_accumulation_4x2_equals_one_batch_of_8(tmp_path: Path) -> None:
    accum = run_tiny_training(
        tiny_text_config(tmp_path / "a", training={"global_batch_size": 8, "micro_batch_size": 2}),
        steps=3,
    )
    single = run_tiny_training(
        tiny_text_config(tmp_path / "b", training={"global_batch_size": 8, "micro_batch_size": 8}),
        steps=3,
    )
    assert len(accum.trainer.dataloaders.train.sampler.step_indices(0, 0)) == 8
    assert accum.losses == pytest.approx(single.losses, abs=1e-5)
    norms = [[m["grad_norm"] for m in run.metrics] for run in (accum, single)]
    assert norms[0] == pytest.approx(norms[1], rel=1e-5)
    wa, wb = final_weights(accum), final_weights(single)
    # AdamW divides by sqrt(v): where a gradient is near zero, a 1e-7 difference in summation
    # order (4 micro-batches' LM-head rows vs 1) moves that element by up to ~1% of a step.
    for k in wa:
        torch.testing.assert_close(wa[k], wb[k], atol=1e-4, rtol=0)


def test_metrics_have_the_documented_keys(tmp_path: Path) -> None:
    run = run_tiny_training(tiny_text_config(tmp_path), steps=2)
    first = run.metrics[0]
    for key in ("step", "loss", "grad_norm", "lr", "tokens_per_s", "padding_ratio"):
        assert key in first, key
    assert (tmp_path / "metrics.jsonl").is_file()


def test_lr_schedule_warmup_then_cosine() -> None:
    from hyper_core.step.optim import lr_factor

    f = [lr_factor(s, kind="cosine", warmup=10, total=110, min_ratio=0.1) for s in range(111)]
    assert f[0] == pytest.approx(0.1) and f[9] == pytest.approx(1.0)
    assert f[10] == pytest.approx(1.0) and f[110] == pytest.approx(0.1)
    assert all(a >= b for a, b in itertools.pairwise(f[10:]))
    lin = [lr_factor(s, kind="linear", warmup=0, total=10, min_ratio=0.0) for s in range(11)]
    assert lin[5] == pytest.approx(0.5) and lin[10] == 0.0
    assert lr_factor(50, kind="constant", warmup=10, total=100, min_ratio=0.0) == 1.0


def test_global_batch_must_divide_over_micro_batches(tmp_path: Path) -> None:
    from hyper_core.errors import ConfigError

    with pytest.raises(ConfigError, match=r"\$\.training"):
        run_tiny_training(
            tiny_text_config(tmp_path, training={"global_batch_size": 6, "micro_batch_size": 4}),
            steps=1,
        )
