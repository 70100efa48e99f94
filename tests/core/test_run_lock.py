"""One run per output directory: a second run exits 2 naming the first; a killed run's lock
file never blocks the next run."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from hyper_core import hookimpl
from hyper_core.config import dump_config, load_config_dict
from hyper_core.errors import UserError
from hyper_core.run_lock import LOCK_NAME, RunLock
from hyper_core.testing import isolated_host, tiny_text_config
from hyper_core.testing.processes import hyper_train

_HOLD = (
    "import sys, time\n"
    "from hyper_core.run_lock import RunLock\n"
    "RunLock(sys.argv[1]).acquire()\n"
    "print('locked', flush=True)\n"
    "time.sleep(300)\n"
)


_HOLD_AND_FORK = (
    "import os, sys, time\n"
    "from hyper_core.run_lock import RunLock\n"
    "RunLock(sys.argv[1]).acquire()\n"
    "if os.fork() == 0:\n"
    "    time.sleep(300)\n"
    "    os._exit(0)\n"
    "print('locked', flush=True)\n"
    "time.sleep(300)\n"
)


@pytest.fixture
def holder(tmp_path: Path) -> Iterator[subprocess.Popen[str]]:
    """Another process holding ``tmp_path / "run"``."""
    out = tmp_path / "run"
    out.mkdir()
    proc = subprocess.Popen(
        [sys.executable, "-c", _HOLD, str(out)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline() == "locked\n"
        yield proc
    finally:
        proc.kill()
        proc.wait()


def test_a_second_run_into_the_same_output_dir_exits_2_naming_the_first(
    tmp_path: Path, holder: subprocess.Popen[str]
) -> None:
    out = tmp_path / "run"
    config = tmp_path / "run.toml"
    config.write_text(dump_config(load_config_dict(tiny_text_config(out))))
    proc = hyper_train(["run", str(config)], timeout=120)
    assert proc.returncode == 2, proc.stderr[-3000:]
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, lines
    assert lines[0].startswith(
        f"hyper-train: error: $.run.output_dir: {out} is in use by another hyper-train run "
        f"(pid {holder.pid} on host {socket.gethostname()}, since "
    )
    assert sorted(p.name for p in out.iterdir()) == [LOCK_NAME]  # nothing written


def test_a_lock_left_by_a_killed_run_does_not_block(
    tmp_path: Path, holder: subprocess.Popen[str]
) -> None:
    out = tmp_path / "run"
    with pytest.raises(UserError, match=f"pid {holder.pid} "):
        RunLock(out).acquire()
    holder.send_signal(signal.SIGKILL)
    holder.wait()
    assert json.loads((out / LOCK_NAME).read_text())["pid"] == holder.pid  # the stale file
    with RunLock(out):
        assert json.loads((out / LOCK_NAME).read_text())["pid"] == os.getpid()


def test_a_forked_child_outliving_a_killed_run_does_not_hold_the_lock(tmp_path: Path) -> None:
    """A data-loader worker forked by rank 0 may outlive its SIGKILLed parent for seconds."""
    out = tmp_path / "run"
    out.mkdir()
    proc = subprocess.Popen(
        [sys.executable, "-c", _HOLD_AND_FORK, str(out)], stdout=subprocess.PIPE, text=True
    )
    children = Path(f"/proc/{proc.pid}/task/{proc.pid}/children")
    child = None
    try:
        assert proc.stdout is not None and proc.stdout.readline() == "locked\n"
        (child,) = (int(pid) for pid in children.read_text().split())
        with pytest.raises(UserError, match=f"pid {proc.pid} "):
            RunLock(out).acquire()
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        os.kill(child, 0)  # the forked child is still alive
        with RunLock(out):
            pass
    finally:
        proc.kill()
        proc.wait()
        if child is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(child, signal.SIGKILL)


def test_the_lock_is_given_back_when_the_with_block_ends(tmp_path: Path) -> None:
    with RunLock(tmp_path):
        with pytest.raises(UserError, match=f"pid {os.getpid()} on host"):
            RunLock(tmp_path).acquire()
    with RunLock(tmp_path):
        pass


class _Crash:
    @hookimpl
    def on_train_begin(self) -> None:
        raise RuntimeError("deliberate")


def test_a_failed_run_gives_the_output_dir_back(tmp_path: Path) -> None:
    from hyper_core.trainer.run import run_training

    host = isolated_host([_Crash()])
    config = load_config_dict(tiny_text_config(tmp_path), sections=host.registries.config_sections)
    with pytest.raises(RuntimeError, match="deliberate"):
        run_training(config, host)
    with RunLock(tmp_path):
        pass


def test_a_run_that_fails_at_start_leaves_no_lock_only_output_dir(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from hyper_core.cli import main

    out = tmp_path / "runs" / "new"
    config = tmp_path / "c.toml"
    config.write_text(dump_config(load_config_dict(tiny_text_config(out))))
    # Fails after taking the lock: more samples per step than the data has.
    assert main(["run", str(config), "--training.global_batch_size=100000"]) == 2
    assert "fewer than one global batch" in capsys.readouterr().err
    assert not (tmp_path / "runs").exists()  # every directory it created is gone
    # A directory that was there before stays, without the lock file; one with content keeps it.
    out.mkdir(parents=True)
    assert main(["run", str(config), "--training.global_batch_size=100000"]) == 2
    assert out.is_dir() and list(out.iterdir()) == []
    (out / "notes.txt").write_text("mine")
    assert main(["run", str(config), "--training.global_batch_size=100000"]) == 2
    assert sorted(p.name for p in out.iterdir()) == [".hyper-train.lock", "notes.txt"]
