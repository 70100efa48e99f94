"""Evaluation on 2 ranks finishes with the 1-rank metrics: over mixed text-only and image
micro-batches on fsdp2 (eval loss, token accuracy, exact-match counts), and over unequal eval
shards on ddp (the rank with fewer micro-batches pads its forwards in lockstep)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from dist_helpers import TwoRankRuns, train_here, vl_available
from test_equivalence import mixed_vl_config, mixed_vl_data

from hyper_core.demo.text import ensure_text_demo
from hyper_core.testing import isolated_host, run_tiny_training, tiny_text_config

pytestmark = pytest.mark.slow
TWO_RANK_TIMEOUT_S = 300


def _vl_config(out: Path, data: Path, **parallel: Any) -> dict[str, Any]:
    cfg = mixed_vl_config(out, data, training={"steps": 3}, parallel=parallel)
    cfg["data"]["eval"] = mixed_vl_data(data)
    return cfg


def _text_config(out: Path) -> dict[str, Any]:
    """9 eval samples on 2 ranks: 4 and 5, so 2 and 3 micro-batches."""
    return tiny_text_config(
        out,
        data={"eval": str(ensure_text_demo("eval")), "eval_samples": 9},
        training={"steps": 1, "micro_batch_size": 2},
        parallel={"strategy": "ddp", "timeout_s": 120},
    )


def two_rank_jobs(root: Path) -> list[dict[str, Any]]:
    """This module's jobs of the shared 2-rank launch (``conftest.two_rank_runs``)."""
    jobs = [{"config": _text_config(root / "text")}]
    if vl_available():
        jobs.append({"config": _vl_config(root / "vl", root / "data", strategy="fsdp2")})
    return jobs


def _eval_records(out: Path) -> list[dict[str, Any]]:
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return [r["eval"] for r in records if "eval" in r]


@pytest.mark.skipif(not vl_available(), reason="hyper-train-qwen-vl not installed")
def test_two_rank_evaluation_equals_one_rank(two_rank_runs: TwoRankRuns, tmp_path: Path) -> None:
    train_here(_vl_config(tmp_path / "one", tmp_path / "data"))
    [one] = _eval_records(tmp_path / "one")
    [two] = _eval_records(two_rank_runs.dir(__name__) / "vl")
    assert two["eval_tokens"] == one["eval_tokens"] > 0
    assert two["count_all"] == one["count_all"] == 64
    assert two["eval_loss"] == pytest.approx(one["eval_loss"], abs=1e-4)
    assert two["token_accuracy"] == pytest.approx(one["token_accuracy"], abs=1e-6)
    assert two["accuracy_all"] == pytest.approx(one["accuracy_all"], abs=1e-6)


def test_two_ranks_with_unequal_eval_shards_give_one_ranks_metrics(
    two_rank_runs: TwoRankRuns, tmp_path: Path
) -> None:
    """9 eval samples on 2 ranks: 4 and 5, so 2 and 3 micro-batches; the rank with fewer pads
    its forwards (lockstep) and the metrics are those of one rank."""
    # every installed plugin, as the rank processes load them
    host = isolated_host(entry_points=True)
    one = run_tiny_training(_text_config(tmp_path / "one"), host=host).eval_metrics
    two_evals = _eval_records(two_rank_runs.dir(__name__) / "text")
    assert len(one) == len(two_evals) == 1
    assert two_evals[0]["eval_tokens"] == one[0]["eval_tokens"]
    assert two_evals[0]["count_all"] == one[0]["count_all"] == 9
    assert two_evals[0]["eval_loss"] == pytest.approx(one[0]["eval_loss"], rel=1e-4)
    assert two_evals[0]["token_accuracy"] == pytest.approx(one[0]["token_accuracy"], abs=1e-3)
