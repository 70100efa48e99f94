"""Token-budget micro-batches on 2 ranks (each step shared by tokens, micro-batch counts that
differ by rank, padded by ``Lockstep``) train with the 1-rank losses."""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest
from dist_helpers import (
    TwoRankRuns,
    assert_close,
    losses,
    one_thread,  # noqa: F401
    text_config,
    train_here,
)

from hyper_core.hookspecs import hookimpl

pytestmark = pytest.mark.slow
TWO_RANK_TIMEOUT_S = 120
WORDS = "red green blue stone river island planet cloud music paper garden window".split()


def long_tailed_data(path: Path) -> Path:
    """200 "Repeat: ..." conversations of 1 to 40 words (log-normal: most short, a long tail)."""
    rng = random.Random(0)
    lines = []
    for _ in range(200):
        words = " ".join(
            rng.choice(WORDS) for _ in range(min(40, int(rng.lognormvariate(1.5, 0.9)) + 1))
        )
        messages = [
            {"role": "user", "content": f"Repeat: {words}"},
            {"role": "assistant", "content": words},
        ]
        lines.append(json.dumps({"messages": messages}))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")
    return path


def _config(out: Path, data: Path, **parallel: Any) -> dict[str, Any]:
    return text_config(
        out,
        data={"train": str(data), "max_tokens_per_micro_batch": 128},
        training={"steps": 3, "global_batch_size": 16, "micro_batch_size": 8},
        parallel=parallel,
    )


def two_rank_jobs(root: Path) -> list[dict[str, Any]]:
    """This module's job of the shared 2-rank launch (``conftest.two_rank_runs``)."""
    data = long_tailed_data(root / "data.jsonl")
    return [{"config": _config(root / "two", data, strategy="ddp"), "inspect": f"{__name__}:steps"}]


class _Recorder:
    """Wraps the run's ``Lockstep``: each step's real micro-batch token counts, and the
    schedule's length after padding."""

    def __init__(self, lockstep: Any) -> None:
        self.lockstep = lockstep
        self.seen: list[dict[str, Any]] = []

    def schedule(self, micro_batches: Sequence[Any]) -> list[Any]:
        out = self.lockstep.schedule(micro_batches)
        self.seen.append({"tokens": [mb.num_tokens for mb in micro_batches], "forwards": len(out)})
        return out


def steps(trainer: Any) -> Callable[[], dict[str, Any]]:
    """Record every rank's micro-batches per step (``dist_worker`` inspect; a collective)."""
    import torch.distributed as dist

    recorder = _Recorder(trainer.lockstep)
    trainer.lockstep = recorder

    def result() -> dict[str, Any]:
        ranks: list[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(ranks, recorder.seen)
        return {"ranks": ranks}

    return result


class _StepTokens:
    """Records the 1-rank run's tokens per step."""

    def __init__(self) -> None:
        self.steps: list[int] = []

    @hookimpl
    def on_step_begin(self, trainer: Any, state: Any, micro_batches: list[Any]) -> None:
        self.steps.append(sum(mb.num_tokens for mb in micro_batches))


@pytest.mark.usefixtures("one_thread")
def test_two_ranks_with_a_token_budget_match_one_rank(
    two_rank_runs: TwoRankRuns, tmp_path: Path
) -> None:
    data = long_tailed_data(tmp_path / "data.jsonl")
    one = _StepTokens()
    train_here(_config(tmp_path / "one", data), plugins=[one])
    out = two_rank_runs.dir(__name__) / "two"
    two = losses(out)
    assert len(two) == 3
    assert_close(two, losses(tmp_path / "one"), 1e-5)
    ranks = json.loads((out / "inspect.json").read_text())["ranks"]
    counts = []
    for step, (r0, r1) in enumerate(zip(*ranks, strict=True)):
        assert sum(r0["tokens"]) + sum(r1["tokens"]) == one.steps[step]
        assert all(0 < t <= 128 for t in r0["tokens"] + r1["tokens"])
        assert r0["forwards"] == r1["forwards"] == max(len(r0["tokens"]), len(r1["tokens"]))
        counts.append((len(r0["tokens"]), len(r1["tokens"])))
    assert any(a != b for a, b in counts), counts  # Lockstep padded a rank
