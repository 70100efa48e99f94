"""Gemma 3 under encoder parallelism on 2 ranks (gloo, CPU) trains like one rank: the
first-party adapter with pan-and-scan crops (a variable number of tiles per image, moved
between ranks with their tile counts), ``varlen`` packed rows with each tile's bidirectional
block, on skewed data. Per-step losses and every parameter's gradient match the one-rank run
within 1e-5."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from ep_helpers import (
    HERE,
    assert_same_training,
    read_metrics,
    torchrun,
    train_one_rank,
    vl_config,
    write_dataset,
)

pytestmark = pytest.mark.slow

MODEL = {
    "adapter": "gemma3",
    "config": "tiny",
    "attn_implementation": "varlen",
    # small crops: the data set's non-square images get 2 crops each, the squares none
    "options": {"pan_and_scan": True, "pan_and_scan_min_crop_size": 16},
}
TOWER = ".vision_tower."


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    root = tmp_path_factory.mktemp("ep_gemma3")
    data = write_dataset(root / "data", "skew")

    def config(name: str, **sections: Any) -> dict[str, Any]:
        return vl_config(root / name, data, model=MODEL, **sections)

    jobs = {
        "ep": {
            "config": config(
                "ep", parallel={"strategy": "fsdp2"}, encoder_parallel={"enabled": True}
            )
        }
    }
    (root / "jobs.json").write_text(json.dumps(jobs))
    proc = torchrun(HERE / "ep_worker.py", [str(root / "jobs.json")])
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    train_one_rank(root / "one-rank", config("one-rank"))
    yield root


def test_gemma3_encoder_parallel_trains_like_one_rank(root: Path) -> None:
    assert_same_training(root / "ep", root / "one-rank", tower=TOWER)
    metrics = read_metrics(root / "ep")
    assert all(m["encoder_parallel/rebalanced"] == 1.0 for m in metrics)
    assert all(0 < m["encoder_parallel/images_moved"] < 1 for m in metrics)
    r1 = json.loads((root / "ep" / "ep_stats-rank1.json").read_text())
    assert r1["images_computed"] > r1["images_owned"]  # rank 0's images, crops and counts
