"""The chunked cross-entropy on 2 ranks (fsdp2: the LM head's weight is the root unit's
unsharded one; ddp) gives the losses and gradient norms of one process without chunks."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from dist_helpers import (
    HERE,
    assert_close,
    grad_norms,
    losses,
    model_config,
    torchrun,
    train_here,
    vl_available,
)

pytestmark = pytest.mark.slow
STEPS = 5
CHUNK = 2  # every micro-batch of these configs has more label tokens: all are chunked

MODELS = [
    "text",
    pytest.param("vl", marks=pytest.mark.skipif(not vl_available(), reason="no qwen-vl")),
]


def _config(model: str, out: Path, chunk: int | None, **parallel: Any) -> dict[str, Any]:
    training = {"steps": STEPS, "loss_chunk_tokens": chunk}
    return model_config(model, out, training=training, parallel=parallel)


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("chunked")
    models = ["text"] + (["vl"] if vl_available() else [])
    jobs = []
    for model in models:
        train_here(_config(model, root / f"{model}-one", None))
        for strategy in ("fsdp2", "ddp"):
            cfg = _config(model, root / f"{model}-{strategy}", CHUNK, strategy=strategy)
            cfg["parallel"]["timeout_s"] = 60
            jobs.append({"config": cfg})
    jobs_file = root / "jobs.json"
    jobs_file.write_text(json.dumps(jobs))
    proc = torchrun(HERE / "dist_worker.py", [str(jobs_file)], nproc=2, timeout=400)
    assert proc.returncode == 0, proc.stderr[-6000:]
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
