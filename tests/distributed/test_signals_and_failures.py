"""Through the launcher (``hyper-train run --nproc-per-node 2``): a failing rank ends the job
naming it; SIGTERM saves a checkpoint, exits 0, and the run resumes from it."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from dist_helpers import hyper_train, losses, subprocess_env, text_config, train_here, write_toml

pytestmark = pytest.mark.slow


def test_a_rank_raising_in_step_3_fails_the_job_and_is_named(tmp_path: Path) -> None:
    toml = write_toml(
        text_config(tmp_path / "run", parallel={"strategy": "ddp"}, logging={"progress": "lines"}),
        tmp_path / "fail.toml",
    )
    t0 = time.monotonic()
    proc = hyper_train(
        ["run", str(toml), "--nproc-per-node", "2", "--plugin", "chaos_plugin"],
        timeout=90,
        HT_FAIL_RANK="1",
        HT_FAIL_AT_STEP="2",
    )
    elapsed = time.monotonic() - t0
    assert proc.returncode == 1, proc.stderr[-4000:]
    assert elapsed < 60
    err = proc.stderr
    report = [line for line in err.splitlines() if re.match(r"hyper-train: (rank \d+ |  c)", line)]
    assert report[0] == (
        "hyper-train: rank 1 failed at step 3: RuntimeError: chaos: injected failure at step 3"
    ), err[-4000:]
    # Rank 0 saw only the consequence (its peer gone, or torchrun's SIGTERM): no cause of its own.
    assert all(line.startswith("hyper-train:   consequence") for line in report[1:]), err[-4000:]
    # Rank 0 alone prints progress: steps 1 and 2 once each, no step 3.
    assert err.count("step 1/10") == 1 and err.count("step 2/10") == 1
    assert "step 3/10" not in err


def sigterm_after(cmd: list[str], out: Path, steps: int, *, group: bool = False) -> tuple[int, str]:
    """Run ``cmd``, SIGTERM it once ``out`` logged ``steps`` steps; ``(returncode, stderr)``.
    ``group``: signal its whole process group, as ``timeout``, a terminal or a scheduler do."""
    proc = subprocess.Popen(
        cmd,
        env=subprocess_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=group,
    )
    try:
        deadline = time.monotonic() + 90
        metrics = out / "metrics.jsonl"
        while not (metrics.is_file() and len(metrics.read_text().splitlines()) >= steps):
            assert proc.poll() is None, proc.communicate()[1][-4000:]
            assert time.monotonic() < deadline, f"the run logged no {steps} steps in 90 s"
            time.sleep(0.2)
        if group:
            os.killpg(proc.pid, signal.SIGTERM)
        else:
            proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    return proc.returncode, err


def test_sigterm_to_the_launcher_saves_exits_zero_and_resumes(tmp_path: Path) -> None:
    out = tmp_path / "run"
    toml = write_toml(
        text_config(
            out,
            parallel={"strategy": "fsdp2"},
            training={"steps": 500, "lr_scheduler": "constant"},
            checkpoint={"resume": "auto"},
        ),
        tmp_path / "term.toml",
    )
    cmd = [sys.executable, "-m", "hyper_core", "run", str(toml), "--nproc-per-node", "2"]
    returncode, err = sigterm_after(cmd, out, 3)
    assert returncode == 0, err[-4000:]
    stopped_at = max(losses(out))
    assert 3 <= stopped_at < 500
    ckpt = out / "checkpoints" / f"step-{stopped_at}"
    assert (ckpt / "COMPLETE").is_file(), err[-4000:]
    assert (out / "checkpoints" / "latest").read_text() == ckpt.name

    # Resume (here on one rank) continues from the next step.
    raw = text_config(
        out,
        parallel={"strategy": "fsdp2"},
        training={"steps": stopped_at + 2, "lr_scheduler": "constant"},
        checkpoint={"resume": "auto"},
    )
    run = train_here(raw)
    assert run.trainer.state.global_step == stopped_at + 2
    assert sorted(losses(out))[-2:] == [stopped_at + 1, stopped_at + 2]


def test_sigterm_to_a_single_process_run_saves_and_exits_zero(tmp_path: Path) -> None:
    """SIGTERM to the process group, data workers included (``timeout``, a scheduler): the
    workers leave it to the trainer, which finishes the step and saves."""
    out = tmp_path / "run"
    toml = write_toml(
        text_config(
            out, training={"steps": 500, "lr_scheduler": "constant"}, data={"num_workers": 2}
        ),
        tmp_path / "term.toml",
    )
    cmd = [sys.executable, "-m", "hyper_core", "run", str(toml)]
    returncode, err = sigterm_after(cmd, out, 2, group=True)
    assert returncode == 0, err[-4000:]
    stopped_at = max(losses(out))
    assert stopped_at < 500
    assert (out / "checkpoints" / f"step-{stopped_at}" / "COMPLETE").is_file(), err[-4000:]
