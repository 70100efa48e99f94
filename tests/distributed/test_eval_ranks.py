"""Evaluation over mixed text-only and image micro-batches on 2 fsdp2 ranks finishes with the
1-rank metrics (eval loss, token accuracy, exact-match counts)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from dist_helpers import HERE, torchrun, train_here, vl_available
from test_equivalence import mixed_vl_config, mixed_vl_data

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not vl_available(), reason="hyper-train-qwen-vl not installed"),
]


def _eval_record(out: Path) -> dict[str, Any]:
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    [last] = [r for r in records if "eval" in r]
    return last["eval"]


def test_two_rank_evaluation_equals_one_rank(tmp_path: Path) -> None:
    data = tmp_path / "data"

    def config(out: Path, **parallel: Any) -> dict[str, Any]:
        cfg = mixed_vl_config(out, data, training={"steps": 3}, parallel=parallel)
        cfg["data"]["eval"] = mixed_vl_data(data)
        return cfg

    train_here(config(tmp_path / "one"))
    jobs = tmp_path / "jobs.json"
    jobs.write_text(json.dumps([{"config": config(tmp_path / "two", strategy="fsdp2")}]))
    proc = torchrun(HERE / "dist_worker.py", [str(jobs)], nproc=2, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    one, two = _eval_record(tmp_path / "one"), _eval_record(tmp_path / "two")
    assert two["eval_tokens"] == one["eval_tokens"] > 0
    assert two["count_all"] == one["count_all"] == 64
    assert two["eval_loss"] == pytest.approx(one["eval_loss"], abs=1e-4)
    assert two["token_accuracy"] == pytest.approx(one["token_accuracy"], abs=1e-6)
    assert two["accuracy_all"] == pytest.approx(one["accuracy_all"], abs=1e-6)
