"""``bash bench/gpu.sh matrix`` (``bench/gpu_matrix.py``) is ready for the next GPU: its cases
are valid configs, it reads a run's figures right, and without CUDA it measures nothing."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from bench import gpu_matrix

REPO = Path(__file__).resolve().parents[2]


def test_the_script_parses() -> None:
    proc = subprocess.run(["bash", "-n", str(REPO / "bench" / "gpu.sh")], capture_output=True)
    assert proc.returncode == 0, proc.stderr


def test_every_case_is_a_valid_config(tmp_path: Path) -> None:
    for case in gpu_matrix.cases(steps=10):
        argv = gpu_matrix.command(case, tmp_path / case.name, "selective")
        validate = [*argv[:3], "config", "validate", *argv[4:]]
        proc = subprocess.run(validate, capture_output=True, text=True, cwd=REPO)
        assert proc.returncode == 0, (case.name, proc.stderr)


def test_the_7b_case_builds_and_is_sized_by_the_estimate() -> None:
    [case] = [c for c in gpu_matrix.cases(steps=10) if c.name == "dense_7b"]
    policy, note = gpu_matrix.estimated_policy(case, 141 * 10**9)  # an H200
    assert policy in ("selective", "every_n", "full"), note
    assert "'none'" in note  # every policy's total is reported


def test_a_run_is_read_into_the_table(tmp_path: Path) -> None:
    rows = [
        {"step": 5, "loss": 9.1, "step_time_s": 3.0, "tokens_per_s": 2700.0, "mfu": 0.1},
        {"eval": {"eval_loss": 8.0}, "step": 5},
        {
            "step": 10,
            "loss": 7.25,
            "step_time_s": 2.0,
            "tokens_per_s": 4096.0,
            "mfu": 0.25,
            "hfu": 0.3,
            "mem_peak_mib": 65536.0,
        },
    ]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    log = (
        "hyper-train: torch.compile: 5 graph(s), 3 recompile(s), 0 graph break(s)\n"
        "hyper-train: attention (flash_varlen): 720 call(s) on the kernel, 4 fell back (...)\n"
    )
    figures = gpu_matrix.read_run(tmp_path, log)
    assert figures["losses"] == [9.1, 7.25]
    assert (figures["step_time_s"], figures["mfu"], figures["hfu"]) == (2.0, 0.25, 0.3)
    assert (figures["graph_breaks"], figures["recompiles"]) == (0, 3)
    assert (figures["attn_kernel_calls"], figures["attn_fallback_calls"]) == (720, 4)
    text = gpu_matrix.table([{"case": "compile", "status": "ok", **figures}])
    assert "25.0%" in text and "30.0%" in text and "64.0" in text and "4,096" in text
    skipped = gpu_matrix.table([{"case": "moe", "status": "skipped: 10 s left"}])
    assert skipped.splitlines()[-1].split()[:3] == ["moe", "-", "-"]


def test_results_are_never_overwritten(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(gpu_matrix, "RESULTS", tmp_path)
    first = gpu_matrix.result_path("NVIDIA H200", "2026-12-05")
    assert first.name == "h200_2026-12-05.json"
    first.write_text("{}")
    assert gpu_matrix.result_path("NVIDIA H200", "2026-12-05").name == "h200_2026-12-05_2.json"
    assert gpu_matrix.result_path("NVIDIA H100 80GB HBM3", "x").name == "h100_x.json"


def test_without_cuda_it_measures_nothing() -> None:
    run = [sys.executable, "-m", "bench.gpu_matrix"]
    proc = subprocess.run(run, capture_output=True, text=True, cwd=REPO)
    assert proc.returncode == 2 and "no CUDA device" in proc.stderr
    proc = subprocess.run([*run, "--only", "nope"], capture_output=True, text=True, cwd=REPO)
    assert proc.returncode == 2 and "fsdp2_bf16" in proc.stderr
