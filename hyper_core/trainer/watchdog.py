"""The step watchdog: a thread on every rank that ends a run in which no step finishes.

A stalled rank (a hung file read, a device fault, a collective that waits on a frozen peer)
otherwise waits for the collective timeout, or forever, and says nothing. The thread runs
beside the step, so a stuck collective does not stop it: every ``interval`` it writes the
rank's heartbeat for the launcher (:func:`~hyper_core.parallel.rank_status.write_beat`), and
when the rank made no progress (no step finished, no stage begun: data, step, log, eval,
checkpoint) for ``[training] stall_timeout_s`` it writes every thread's Python stack
to ``output_dir/stacks/rank-R.txt`` (faulthandler), records the stall, and ends the process
with exit code 1.
"""

from __future__ import annotations

import faulthandler
import logging
import os
import sys
import threading
import time
from pathlib import Path

from ..parallel.rank_status import beat_interval, status_dir, step_of, write_beat, write_status

log = logging.getLogger("hyper_train")

#: Exit code of a rank that the watchdog ended.
EXIT_STALLED = 1


class StepWatchdog:
    """Heartbeat and stall detection for one rank of one run (:meth:`start` … :meth:`stop`)."""

    def __init__(self, *, rank: int, stall_timeout_s: float | None, stacks_dir: Path) -> None:
        self.rank = rank
        self.stall_timeout_s = stall_timeout_s
        self.stacks_dir = stacks_dir
        self.interval = beat_interval(stall_timeout_s)
        self.step = 0
        self.stage = "setup"
        self._progress_at = time.monotonic()
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._beats = status_dir() is not None
        self._thread: threading.Thread | None = None

    def start(self, step: int) -> None:
        """Start the clock at ``step`` (the first step is counted from now)."""
        self.finished(step)
        self._thread = threading.Thread(target=self._run, name="hyper-train-watchdog", daemon=True)
        self._thread.start()

    def finished(self, step: int) -> None:
        """Step ``step`` finished: the stall clock restarts."""
        self.step = step
        self._progress_at = time.monotonic()
        self._beat()  # now: the launcher names this step if the rank is killed next

    def enter(self, stage: str) -> None:
        """The rank now works on ``stage`` (``data``, ``step``, ``log``, ``eval``,
        ``checkpoint``): progress too, so the timeout bounds each stage, not their sum."""
        self.stage = stage
        self._progress_at = time.monotonic()
        self._beat()

    def stop(self) -> None:
        """Stop the thread (the run ended or failed)."""
        self._stop.set()
        self._wake.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=self.interval + 1)

    def _beat(self, stalled: bool = False) -> None:
        """The heartbeat file (only under the launcher; a small file's atomic rewrite)."""
        if self._beats:
            write_beat({"step": self.step, "stage": self.stage, "stalled": stalled})

    def _run(self) -> None:
        while True:
            self._wake.wait(self.interval)
            self._wake.clear()
            if self._stop.is_set():
                return
            self._beat()
            idle = time.monotonic() - self._progress_at
            if self.stall_timeout_s and idle > self.stall_timeout_s:
                self._stalled(idle)

    def _stalled(self, idle: float) -> None:
        """Dump the stacks, report, and end the process (the main thread is stuck)."""
        stacks = self.stacks_dir / f"rank-{self.rank}.txt"
        where = f"step {step_of(self.step, self.stage)}, stage {self.stage}"
        try:
            stacks.parent.mkdir(parents=True, exist_ok=True)
            with stacks.open("w") as f:
                f.write(f"rank {self.rank}: no progress for {idle:.0f} s ({where})\n")
                faulthandler.dump_traceback(file=f, all_threads=True)
        except OSError as exc:
            stacks = Path(f"(not written: {exc.strerror})")
        message = (
            f"stalled: no progress for {idle:.0f} s "
            f"([training] stall_timeout_s = {self.stall_timeout_s:g}) at {where}; "
            f"stacks in {stacks}"
        )
        self._beat(stalled=True)
        write_status("failed", error=message, stalled=True, step=self.step, stage=self.stage)
        log.error("watchdog: rank %d %s", self.rank, message)
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
        os._exit(EXIT_STALLED)
