"""One run per output directory: an exclusive ``flock`` on ``output_dir/.hyper-train.lock``.

The kernel releases a ``flock`` when its process dies (even by SIGKILL), so a lock file left by
a killed run never blocks the next one: only a live holder does. The file holds the holder's
pid, host and start time, for the message a second run prints.

A ``flock`` belongs to the open file, which a forked child (a data-loader worker) shares: the
child closes its copy at fork, so a worker that outlives a killed run does not hold the lock.
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import time
from pathlib import Path
from types import TracebackType

from .errors import UserError

LOCK_NAME = ".hyper-train.lock"


class RunLock:
    """``with RunLock(output_dir):`` holds the directory for this process, or raises
    :class:`UserError` naming the run that holds it."""

    def __init__(self, output_dir: str | os.PathLike[str]) -> None:
        self.path = Path(output_dir) / LOCK_NAME
        self._fd: int | None = None

    def acquire(self) -> None:
        """Take the lock (the directory must exist); :class:`UserError` if a live run holds it."""
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            raise UserError(f"$.run.output_dir: cannot write {self.path}: {exc.strerror}") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _describe(os.read(fd, 4096))
            os.close(fd)
            raise UserError(
                f"$.run.output_dir: {self.path.parent} is in use by another hyper-train run "
                f"({holder}); wait for it to end, or choose another output_dir"
            ) from None
        except BaseException:
            os.close(fd)
            raise
        record = {"pid": os.getpid(), "host": socket.gethostname(), "started": time.time()}
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(record).encode(), 0)
        self._fd = fd
        os.register_at_fork(after_in_child=self._forget_in_child)

    def _forget_in_child(self) -> None:
        """In a forked child: close the inherited descriptor (the parent keeps the lock)."""
        if self._fd is not None:
            fd, self._fd = self._fd, None
            os.close(fd)

    def release(self) -> None:
        """Give the lock back (the file stays: removing it would race with a new holder)."""
        if self._fd is None:
            return
        fd, self._fd = self._fd, None
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)

    def __enter__(self) -> RunLock:
        self.acquire()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.release()


def _describe(raw: bytes) -> str:
    """``pid 123 on host h, since 2025-01-01 12:00:00`` from the lock file's record."""
    try:
        record = json.loads(raw)
        started = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(float(record["started"])))
        return f"pid {int(record['pid'])} on host {record['host']}, since {started}"
    except (ValueError, KeyError, TypeError):
        return "pid and host unknown: it is starting"
