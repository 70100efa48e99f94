"""Faults injected into 2-rank launches (``hyper-train run --nproc-per-node 2``): the launch
ends (never hangs), its report names the rank and cause that started it, and the latest
complete checkpoint reads back (``test_resume.py`` resumes after a torn save bit-identically).
Each case is a tiny text run of a few steps; every subprocess has a time limit, and the
end-to-end bound only guards against a hang."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from dist_helpers import hyper_train, losses, subprocess_env, text_config, write_toml

pytestmark = [pytest.mark.slow, pytest.mark.timeout(150)]

#: A launch that ends later than this hung (the faults below end in seconds).
HANG_S = 90


def _config(tmp_path: Path, **sections: dict[str, Any]) -> tuple[Path, Path]:
    out = tmp_path / "run"
    raw = text_config(
        out,
        parallel={"strategy": "ddp", "timeout_s": 60},
        training={"steps": 8, "lr_scheduler": "constant", "stall_timeout_s": 60},
        checkpoint={"every_steps": 2},
    )
    for name, values in sections.items():
        raw[name].update(values)
    return out, write_toml(raw, tmp_path / "run.toml")


def _launch(toml: Path, **env: str) -> tuple[subprocess.CompletedProcess[str], float]:
    t0 = time.monotonic()
    proc = hyper_train(
        ["run", str(toml), "--nproc-per-node", "2", "--plugin", "chaos_plugin"],
        timeout=HANG_S,
        **env,
    )
    return proc, time.monotonic() - t0


def _report(stderr: str) -> list[str]:
    """The launcher's report: its lines naming ranks."""
    lines = stderr.splitlines()
    return [line for line in lines if re.match(r"hyper-train: (rank \d+ |  consequence)", line)]


def _readable(ckpt: Path, step: int) -> None:
    """The checkpoint's shards are all there (sizes as its metadata lists) and each rank's
    state reads back at ``step`` (what a resume reads before loading)."""
    from hyper_core.checkpoint import check_shards, read_extra_state

    check_shards(ckpt)
    for rank in (0, 1):
        assert read_extra_state(ckpt, rank)["train_state"]["global_step"] == step


def test_a_rank_killed_while_saving_is_named_and_latest_stays_complete(tmp_path: Path) -> None:
    """SIGKILL (the out-of-memory killer, a preemption's grace run out) of rank 1 in the middle
    of writing step-4: the report blames rank 1 and its signal, not rank 0's lost connection;
    ``latest`` still names step-2, complete and readable (the torn step-4 is never loaded)."""
    out, toml = _config(tmp_path)
    proc, elapsed = _launch(toml, HT_SIGNAL_IN_SAVE_STEP="4", HT_KILL_RANK="1")
    assert proc.returncode == 1, proc.stderr[-4000:]
    report = _report(proc.stderr)
    assert report[0] == (
        "hyper-train: rank 1 was killed by signal 9 (SIGKILL: out of memory?) "
        "at step 4 (checkpoint)"
    ), proc.stderr[-4000:]
    assert all("consequence" in line for line in report[1:]), report
    assert "Traceback" not in proc.stderr
    assert elapsed < HANG_S
    ckpts = out / "checkpoints"
    assert (ckpts / "latest").read_text() == "step-2"
    assert not (ckpts / "step-4").exists()
    _readable(ckpts / "step-2", 2)


def test_a_dead_data_worker_is_named_by_its_rank(tmp_path: Path) -> None:
    _, toml = _config(tmp_path, data={"num_workers": 1})
    proc, elapsed = _launch(toml, HT_KILL_WORKER_AT_STEP="3", HT_KILL_RANK="0")
    assert proc.returncode == 1, proc.stderr[-4000:]
    report = _report(proc.stderr)
    assert re.fullmatch(
        r"hyper-train: rank 0 failed at step 4: data worker 0 of rank 0 died \(signal 9\)",
        report[0],
    ), proc.stderr[-4000:]
    assert all("consequence: rank 1" in line for line in report[1:]), report
    assert "Traceback" not in proc.stderr
    assert elapsed < HANG_S


def test_a_stalled_rank_is_named_and_the_others_dump_their_stacks(tmp_path: Path) -> None:
    """Rank 1 freezes (SIGSTOP) as step 4 begins; rank 0 waits in a collective. After
    ``stall_timeout_s`` rank 0's watchdog dumps its stacks and exits; the launcher names rank
    1, frozen, and ends it."""
    out, toml = _config(tmp_path, training={"stall_timeout_s": 3})
    proc, elapsed = _launch(toml, HT_KILL_AT_STEP="3", HT_KILL_RANK="1", HT_KILL_SIGNAL="SIGSTOP")
    assert proc.returncode == 1, proc.stderr[-4000:]
    report = _report(proc.stderr)
    assert re.match(
        r"hyper-train: rank 1 stalled at step 4( \(\w+\))?: its heartbeat stopped; the process "
        r"was stopped by a signal \(SIGSTOP\?\)",
        report[0],
    ), proc.stderr[-4000:]
    assert any("consequence: rank 0 stalled: no progress" in line for line in report)
    stacks = (out / "stacks" / "rank-0.txt").read_text()
    assert "rank 0: no progress" in stacks and "all_reduce" in stacks
    assert elapsed < HANG_S


def _signal_when(
    cmd: list[str], out: Path, steps: int, sig: signal.Signals, **env: str
) -> tuple[int, str]:
    """Run ``cmd``; send ``sig`` to it once ``out`` logged ``steps`` steps."""
    proc = subprocess.Popen(
        cmd, env=subprocess_env(**env), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        deadline = time.monotonic() + HANG_S
        metrics = out / "metrics.jsonl"
        while not (metrics.is_file() and len(metrics.read_text().splitlines()) >= steps):
            assert proc.poll() is None, proc.communicate()[1][-4000:]
            assert time.monotonic() < deadline, f"the run logged no {steps} steps"
            time.sleep(0.2)
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=HANG_S)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    return proc.returncode, err


def test_sigint_to_the_launcher_stops_every_rank_with_a_checkpoint(tmp_path: Path) -> None:
    """``kill -INT <launcher>`` (a supervisor, a notebook): every rank stops after its step,
    one checkpoint is saved, exit 0, and the resume hint is printed."""
    out, toml = _config(tmp_path, training={"steps": 500}, checkpoint={"every_steps": None})
    cmd = [sys.executable, "-m", "hyper_core", "run", str(toml), "--nproc-per-node", "2"]
    returncode, err = _signal_when(cmd, out, 2, signal.SIGINT)
    assert returncode == 0, err[-4000:]
    stopped_at = max(losses(out))
    assert 2 <= stopped_at < 500
    assert "hyper-train: received SIGINT: every rank stops after its current step" in err
    assert f"interrupted at step {stopped_at}/500; checkpoint saved" in err, err[-4000:]
    assert "run the same command with --checkpoint.resume=auto" in err
    ckpts = out / "checkpoints"
    assert [p.name for p in ckpts.glob("step-*")] == [f"step-{stopped_at}"]
    assert (ckpts / "latest").read_text() == f"step-{stopped_at}"
    _readable(ckpts / f"step-{stopped_at}", stopped_at)


def test_sigterm_to_one_rank_while_it_saves_ends_cleanly(tmp_path: Path) -> None:
    """SIGTERM to rank 1 while step-4 is written (preemption): the write completes, every
    rank stops after the next step, saves it, and the launch exits 0."""
    out, toml = _config(tmp_path, training={"steps": 500})
    proc, elapsed = _launch(
        toml, HT_SIGNAL_IN_SAVE_STEP="4", HT_KILL_RANK="1", HT_KILL_SIGNAL="SIGTERM"
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    ckpts = out / "checkpoints"
    assert (ckpts / "step-4" / "COMPLETE").is_file()
    assert (ckpts / "latest").read_text() == "step-5"
    _readable(ckpts / "step-4", 4)
    _readable(ckpts / "step-5", 5)
    assert max(losses(out)) == 5
    assert "at step 5/500; checkpoint saved" in proc.stderr, proc.stderr[-4000:]
    assert elapsed < HANG_S
