"""How a rank describes its failure to the launcher, and the step watchdog (no torchrun)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from hyper_core.parallel.rank_status import STATUS_DIR_ENV, describe_error, is_collective_error


def test_a_dead_data_worker_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RANK", "1")
    killed = RuntimeError("DataLoader worker (pid 4242) is killed by signal: Killed. ")
    assert describe_error(killed) == ("a data worker (pid 4242) of rank 1 died (signal 9)", False)
    exited = RuntimeError("DataLoader worker (pid(s) 4243) exited unexpectedly")
    assert describe_error(exited)[0] == "a data worker (pid 4243) of rank 1 died (exited)"


def test_a_lost_peer_is_a_consequence() -> None:
    reset = RuntimeError("[gloo/transport/tcp/pair.cc:537] Read error: Connection reset by peer")
    assert describe_error(reset) == (f"RuntimeError: {reset}", True)
    assert is_collective_error(reset)
    assert not is_collective_error(RuntimeError("chaos: injected failure at step 3"))
    assert not is_collective_error(ValueError("gloo"))


STALLING_RANK = """
import time
from pathlib import Path
from hyper_core.trainer.watchdog import StepWatchdog

def wait_for_data():
    time.sleep(30)

dog = StepWatchdog(rank=1, stall_timeout_s=1, stacks_dir=Path({stacks!r}))
dog.start(6)
dog.enter("data")
wait_for_data()
"""


def test_the_watchdog_dumps_the_stacks_and_ends_a_stalled_rank(tmp_path: Path) -> None:
    stacks = tmp_path / "stacks"
    env = {"RANK": "1", STATUS_DIR_ENV: str(tmp_path), "PATH": "/usr/bin:/bin"}
    script = STALLING_RANK.format(stacks=str(stacks))
    proc = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 1, proc.stderr
    dump = (stacks / "rank-1.txt").read_text()
    assert dump.startswith("rank 1: no progress for")
    assert "in wait_for_data" in dump
    status = json.loads((tmp_path / "rank-1.json").read_text())
    assert status["status"] == "failed" and status["stalled"]
    assert status["error"].startswith("stalled: no progress for")
    assert "at step 7, stage data" in status["error"]
    beat = json.loads((tmp_path / "rank-1.beat").read_text())
    assert beat["step"] == 6 and beat["stage"] == "data" and beat["stalled"]


def test_a_native_crash_is_recorded_for_the_launcher(tmp_path: Path) -> None:
    script = (
        "import os, signal\n"
        "from hyper_core.parallel.rank_status import record_crashes\n"
        "keep = record_crashes()\n"
        "def crash_here():\n"
        "    os.kill(os.getpid(), signal.SIGSEGV)\n"
        "crash_here()\n"
    )
    env = {"RANK": "0", STATUS_DIR_ENV: str(tmp_path), "PATH": "/usr/bin:/bin"}
    proc = subprocess.run([sys.executable, "-c", script], env=env, timeout=60, check=False)
    assert proc.returncode == -11
    report = (tmp_path / "rank-0.crash").read_text()
    assert report.startswith("Fatal Python error: Segmentation fault")
    assert "in crash_here" in report
