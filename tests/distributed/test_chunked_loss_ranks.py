"""The chunked cross-entropy on 2 ranks (fsdp2: the LM head's weight is the root unit's
unsharded one; ddp) gives the losses and gradient norms of one process without chunks."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from dist_helpers import (
    TwoRankRuns,
    assert_close,
    grad_norms,
    losses,
    model_config,
    train_here,
    vl_available,
)

pytestmark = pytest.mark.slow
TWO_RANK_TIMEOUT_S = 400
STEPS = 5
CHUNK = 2  # every micro-batch of these configs has more label tokens: all are chunked

MODELS = [
    "text",
    pytest.param("vl", marks=pytest.mark.skipif(not vl_available(), reason="no qwen-vl")),
]


def _config(model: str, out: Path, chunk: int | None, **parallel: Any) -> dict[str, Any]:
    training = {"steps": STEPS, "loss_chunk_tokens": chunk}
    return model_config(model, out, training=training, parallel=parallel)


def two_rank_jobs(root: Path) -> list[dict[str, Any]]:
    """This module's jobs of the shared 2-rank launch (``conftest.two_rank_runs``)."""
    models = ["text"] + (["vl"] if vl_available() else [])
    return [
        {"config": _config(model, root / f"{model}-{strategy}", CHUNK, strategy=strategy)}
        for model in models
        for strategy in ("fsdp2", "ddp")
    ]


@pytest.fixture(scope="module")
def runs(two_rank_runs: TwoRankRuns) -> Path:
    """The 2-rank runs, and next to them the 1-process references without chunks."""
    root = two_rank_runs.dir(__name__)
    for model in ["text"] + (["vl"] if vl_available() else []):
        train_here(_config(model, root / f"{model}-one", None))
    return root


@pytest.mark.parametrize("strategy", ["fsdp2", "ddp"])
@pytest.mark.parametrize("model", MODELS)
def test_chunked_on_two_ranks_matches_one_process(runs: Path, model: str, strategy: str) -> None:
    one, two = runs / f"{model}-one", runs / f"{model}-{strategy}"
    assert_close(losses(two), losses(one), 1e-5)
    norms, reference = grad_norms(two), grad_norms(one)
    assert sorted(norms) == sorted(reference)
    for step, norm in norms.items():  # norms are ~3-5: 1e-5 relative is ~20 float32 ulps
        assert norm == pytest.approx(reference[step], rel=1e-5), (step, norms, reference)
