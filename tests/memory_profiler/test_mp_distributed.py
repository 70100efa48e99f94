"""Under 2-rank FSDP2 each rank holds about half the parameters (gloo, 2 CPU processes)."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import pytest
from mp_helpers import PROFILER_ON, read_metrics, run_in_process, write_config

from hyper_memory_profiler.report import measured_state

FSDP2 = '\n[parallel]\nstrategy = "fsdp2"\nbackend = "gloo"\n'


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_fsdp2_two_ranks_hold_half_each(tmp_path: pathlib.Path) -> None:
    single_cfg = write_config(tmp_path / "one.toml", tmp_path / "one", extra=PROFILER_ON + FSDP2)
    run_in_process(single_cfg, ["--training.steps=2"])
    single = json.loads((tmp_path / "one" / "memory" / "summary.json").read_text())
    one = measured_state(single["ranks"][0])

    cfg = write_config(tmp_path / "two.toml", tmp_path / "two", extra=PROFILER_ON + FSDP2)
    env = dict(os.environ, OMP_NUM_THREADS="1")
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        "2",
        "-m",
        "hyper_core",
        "run",
        str(cfg),
        "--training.steps=2",
    ]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=540)
    assert proc.returncode == 0, proc.stderr[-4000:]
    summary = json.loads((tmp_path / "two" / "memory" / "summary.json").read_text())
    assert summary["status"] == "completed"
    assert summary["run"]["world_size"] == 2 and summary["run"]["dp_shard"] == 2
    ranks = summary["ranks"]
    assert [r["rank"] for r in ranks] == [0, 1]
    states = [measured_state(r) for r in ranks]
    for cat in ("params", "grads"):
        full = one[cat]["total"]
        for st in states:
            assert 0.45 * full <= st[cat]["total"] <= 0.55 * full, cat
        # the unpadded local shards partition the parameters exactly
        assert sum(st[cat]["total"] for st in states) == full, cat
    for st in states:
        assert 0.45 <= st["optimizer"]["total"] / one["optimizer"]["total"] <= 0.56
    # rank 1 builds on meta (rank 0 broadcasts the weights): no memory held before sharding
    built = {r["rank"]: next(s for s in r["stages"] if s["stage"] == "build_model") for r in ranks}
    assert built[1]["params"]["total"] == 0 and built[1]["params"]["meta"] > 0
    assert built[0]["params"]["total"] == one["params"]["total"]
    # the in-run estimate (rank 0, 2 shards) is exact for the model state
    comp = summary["comparison"]
    for key in ("params", "grads", "optimizer"):
        assert comp[key]["measured"] == comp[key]["estimate"], key
    metrics = read_metrics(tmp_path / "two")
    assert all(m["mem/step_peak_mib"] > 0 for m in metrics)
