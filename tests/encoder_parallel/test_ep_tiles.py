"""A tile-based VL adapter on 2 ranks (gloo, CPU) trains like one rank, with no override of its
vision methods: the ``new-plugin --vision --tiles`` scaffold (a tiny InternVL, each image a
variable number of tiles whose count is per-image metadata) on skewed data.

* ``encoder_parallel`` (fsdp2): whole images move between ranks, their tiles with their tile
  counts (``VisionEncoderSpec.meta_keys``), and the features come back per image;
* ``cp = 2`` (fsdp2, ``varlen``): the tokens are split, the tower runs whole in the forward.

Per-step losses and every parameter's gradient match the one-rank run within 1e-5.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from ep_helpers import (
    HERE,
    REPO,
    assert_same_training,
    read_metrics,
    torchrun,
    train_one_rank,
    vl_config,
    write_dataset,
)

from hyper_core.scaffold import scaffold

pytestmark = pytest.mark.slow

PLUGIN = "hyper_ep_tiles.plugin"
MODEL = {"adapter": "ep_tiles", "config": "tiny"}
VARLEN = {**MODEL, "attn_implementation": "varlen"}
TOWER = ".vision_tower."


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    root = tmp_path_factory.mktemp("ep_tiles")
    package = scaffold("ep-tiles", "adapter", root / "pkg", vision=True, tiles=True)
    data = write_dataset(root / "data", "skew")

    def config(name: str, model: dict[str, Any], **sections: Any) -> dict[str, Any]:
        return vl_config(root / name, data, model=model, **sections)

    jobs = {
        "ep": {
            "config": config(
                "ep", MODEL, parallel={"strategy": "fsdp2"}, encoder_parallel={"enabled": True}
            ),
            "plugins": [PLUGIN],
        },
        "cp": {
            "config": config("cp", VARLEN, parallel={"strategy": "fsdp2", "cp": 2}),
            "plugins": [PLUGIN],
        },
    }
    (root / "jobs.json").write_text(json.dumps(jobs))
    proc = torchrun(
        HERE / "ep_worker.py", [str(root / "jobs.json")], importable=(HERE, REPO, package)
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    sys.path.insert(0, str(package))
    try:
        train_one_rank(root / "one-rank", config("one-rank", MODEL), [PLUGIN])
        train_one_rank(root / "one-rank-varlen", config("one-rank-varlen", VARLEN), [PLUGIN])
    finally:
        sys.path.remove(str(package))
    yield root


def test_encoder_parallel_moves_tiled_images_and_trains_like_one_rank(root: Path) -> None:
    assert_same_training(root / "ep", root / "one-rank", tower=TOWER)
    metrics = read_metrics(root / "ep")
    assert all(m["encoder_parallel/rebalanced"] == 1.0 for m in metrics)
    assert all(0 < m["encoder_parallel/images_moved"] < 1 for m in metrics)
    r0, r1 = (json.loads((root / "ep" / f"ep_stats-rank{r}.json").read_text()) for r in (0, 1))
    assert r1["images_computed"] > r1["images_owned"]  # rank 0's images, tiles and counts
    assert r0["encoder_calls"] == r1["encoder_calls"]


def test_context_parallel_trains_like_one_rank(root: Path) -> None:
    assert_same_training(root / "cp", root / "one-rank-varlen", tower=TOWER)
