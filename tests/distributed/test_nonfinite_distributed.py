"""Two ranks agree on non-finite steps: only rank 1 sees a NaN loss, both skip that update;
a divergence stops every rank with exit 1, naming it, without a traceback.

This module is also the ranks' plugin (``--plugin test_nonfinite_distributed``), driven by env
variables: ``HT_NAN_RANK`` + ``HT_NAN_AT_STEP`` make that rank's loss NaN at that step (1-based;
the gradients stay finite, so only the loss shows it); every rank appends ``{step, bad_steps,
weights}`` (a checksum of its parameters) to ``output_dir/rank-R.jsonl`` after each step.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from dist_helpers import hyper_train, losses, text_config, write_toml

from hyper_core import hookimpl

pytestmark = pytest.mark.slow

PLUGIN = ["--plugin", "test_nonfinite_distributed"]


@hookimpl
def on_train_begin(trainer: Any) -> None:
    """Wrap the loss of the configured rank."""
    if os.environ.get("RANK") != os.environ.get("HT_NAN_RANK"):
        return
    at = int(os.environ["HT_NAN_AT_STEP"])
    loss_fn: Callable[..., Any] = trainer.loss_fn

    def poisoned(*args: Any) -> Any:
        loss, parts = loss_fn(*args)
        if trainer.state.global_step + 1 == at:
            loss = loss + (float("nan") - loss.detach())  # NaN value, the same gradients
        return loss, parts

    trainer.loss_fn = poisoned


@hookimpl
def on_step_end(trainer: Any, state: Any) -> None:
    """Record this rank's bad-step count and weights after the step."""
    checksum = sum(float(p.detach().double().sum()) for p in trainer.model.parameters())
    record = {"step": state.global_step, "bad_steps": state.bad_steps, "weights": checksum}
    path = Path(trainer.config.run.output_dir) / f"rank-{trainer.dist.rank}.jsonl"
    with path.open("a") as f:
        f.write(json.dumps(record) + "\n")


def records(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_only_rank_1_sees_a_nan_loss_and_both_ranks_skip_that_step(tmp_path: Path) -> None:
    out = tmp_path / "run"
    toml = write_toml(
        text_config(out, parallel={"strategy": "ddp"}, training={"steps": 5}),
        tmp_path / "nan.toml",
    )
    proc = hyper_train(
        ["run", str(toml), "--nproc-per-node", "2", *PLUGIN],
        timeout=120,
        HT_NAN_RANK="1",
        HT_NAN_AT_STEP="3",
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    rank0, rank1 = records(out / "rank-0.jsonl"), records(out / "rank-1.jsonl")
    assert [r["bad_steps"] for r in rank0] == [0, 0, 1, 1, 1]
    assert rank0 == rank1  # the same steps skipped, the same weights after every step
    assert rank0[1]["weights"] == rank0[2]["weights"] != rank0[3]["weights"]
    logged = losses(out)
    assert math.isnan(logged[3]) and all(math.isfinite(logged[s]) for s in (1, 2, 4, 5))
    assert "step 3: non-finite loss (nan); update skipped (1 in a row" in proc.stderr


def test_divergence_on_two_ranks_exits_1_with_one_line(tmp_path: Path) -> None:
    out = tmp_path / "run"
    toml = write_toml(
        text_config(
            out,
            parallel={"strategy": "ddp"},
            training={"lr": 1e10, "max_bad_steps": 2},
            checkpoint={"every_steps": 1},
        ),
        tmp_path / "diverge.toml",
    )
    proc = hyper_train(["run", str(toml), "--nproc-per-node", "2"], timeout=120)
    assert proc.returncode == 1, proc.stderr[-4000:]
    err = proc.stderr
    assert "TrainingDiverged: training diverged: 2 steps in a row" in err, err[-4000:]
    assert "Traceback" not in err
    # Saved on schedule up to the step before the stop (its weights those of the last good
    # step), nothing at the stop.
    stopped_at = max(losses(out))
    checkpoints = out / "checkpoints"
    assert (checkpoints / "latest").read_text() == f"step-{stopped_at - 1}"
    assert not (checkpoints / f"step-{stopped_at}").exists()
