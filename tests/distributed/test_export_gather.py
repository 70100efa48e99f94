"""The streamed export gathers each sharded tensor to rank 0 only: the other ranks send their
rows and never hold a whole tensor (before, ``full_tensor`` all-gathered it on every rank)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from dist_helpers import HERE, torchrun

pytestmark = pytest.mark.slow


def test_only_rank0_materializes_the_full_tensors(tmp_path: Path) -> None:
    proc = torchrun(HERE / "export_gather_worker.py", [str(tmp_path)], nproc=4, timeout=240)
    assert proc.returncode == 0, proc.stderr[-4000:]
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(4)]
    main, others = ranks[0], ranks[1:]
    assert main["keys"] == ["cols.w", "hsdp.w", "layers.0.b", "layers.0.w"]
    assert main["exact"] and main["devices"] == ["cpu"]
    # rows: one padded chunk per rank gathered into rank 0, never all-gathered
    assert main["gather"] == [[[2, 3], True], [[1], True], [[3, 2], True]]
    for rank, record in enumerate(others, 1):
        assert record["keys"] == [], rank
        sends = [[[2, 3], False], [[1], False]]  # rank 1's and 3's rows of layers.0 (padded)
        if rank == 1:  # HSDP: rank 1 is in rank 0's shard group; ranks 2, 3 are a replica
            sends.append([[3, 2], False])
        assert record["gather"] == sends, (rank, record["gather"])
    # a column shard is the one layout still all-gathered, on every rank
    assert all(record["full_tensor"] == [[3, 8]] for record in ranks)
