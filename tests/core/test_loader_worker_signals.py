"""Data workers sit in a process group of their own, so the signals a terminal or ``timeout``
send to the run's group reach only the trainer (which finishes its step and saves), while a
SIGTERM to the worker itself, the loader's and multiprocessing's way of ending it, still
ends it. (The whole run under a group SIGTERM: tests/distributed/test_signals_and_failures.)"""

from __future__ import annotations

import multiprocessing
import os
import signal
import time

from hyper_core.data.step_loader import _worker_init


def _worker() -> None:
    _worker_init(0)
    time.sleep(60)


def _wait_for_own_group(pid: int) -> None:
    deadline = time.monotonic() + 10
    while os.getpgid(pid) != pid:
        assert time.monotonic() < deadline, "the worker never left its parent's group"
        time.sleep(0.01)


def test_a_worker_leaves_the_group_ignores_sigint_and_ends_on_sigterm() -> None:
    proc = multiprocessing.get_context("fork").Process(target=_worker, daemon=True)
    proc.start()
    try:
        _wait_for_own_group(proc.pid)
        assert os.getpgid(proc.pid) != os.getpgid(0)
        os.kill(proc.pid, signal.SIGINT)
        proc.join(timeout=0.5)
        assert proc.is_alive()  # Ctrl-C is the trainer's to handle
        proc.terminate()
        proc.join(timeout=10)
        assert not proc.is_alive() and proc.exitcode == -signal.SIGTERM
    finally:
        if proc.is_alive():
            proc.kill()
