"""The ranks' output, relayed by the launcher so its failure report can quote each rank's last
line.

The launcher makes two named pipes per local rank in its status folder
(``output-L.stdout``, ``output-L.stderr``) and copies what arrives to its own streams
(:class:`OutputRelay`); a rank it started sends its stdout and stderr there
(:func:`connect_output`). The relay keeps a bounded tail of each rank's lines
(:class:`OutputTail`); :func:`meaningful_line` picks the one worth quoting: not a progress
bar's fragment, a traceback's frame or a C++ library's log line.
"""

from __future__ import annotations

import contextlib
import os
import re
import selectors
import stat
import sys
import threading
from collections import deque
from collections.abc import Iterable
from pathlib import Path
from typing import BinaryIO

from .rank_status import STATUS_DIR_ENV

#: Set on a rank whose stderr was a terminal before it was relayed (progress bars stay on).
RELAYED_TTY_ENV = "HYPER_TRAIN_RELAYED_TTY"

#: Lines kept per rank, and characters kept per line (the relay's memory is bounded).
TAIL_LINES = 32
LINE_CHARS = 500

_STREAMS = ("stdout", "stderr")

_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
_RANK_PREFIX = re.compile(r"^\[(?:rank|default)\d+\]:\s?")
_NOISE = (
    re.compile(r"^\s"),  # a traceback's frame or source line, a warning's source line
    re.compile(r"^Traceback \(most recent call last\):"),
    re.compile(r"^(During handling of the above|The above exception was the direct)"),
    re.compile(r"^\[?[WEIF]\d{4} \d\d:\d\d:\d\d"),  # a glog line (c10, gloo, nccl)
    re.compile(r"^\[[^\]\s]+\.(?:cc|cpp|cu|h|hpp):\d+\]"),  # gloo's [file.cc:N] dump
    re.compile(r"\d{1,3}%\s*\||[█▉▊▋▌▍▎▏━╸╺]|\|[#=>.\s-]{3,}\|"),  # a progress bar
)


def _visible(raw: bytes) -> str:
    """What a terminal shows of one line: the text after its last carriage return (an
    animation's earlier frames are overwritten), without colours, at most LINE_CHARS."""
    text = raw.decode(errors="replace")
    frames = [f for f in text.split("\r") if f.strip()]
    text = frames[-1] if frames else ""
    return _ANSI.sub("", text).rstrip()[:LINE_CHARS]


def meaningful_line(lines: Iterable[str]) -> str | None:
    """The last of ``lines`` worth quoting (see the module docstring); None if none is."""
    for line in reversed(list(lines)):
        line = _RANK_PREFIX.sub("", line)
        if line.strip() and not any(p.search(line) for p in _NOISE):
            return line.strip()
    return None


class OutputTail:
    """The last :data:`TAIL_LINES` lines of one rank's streams, as they arrive in chunks."""

    def __init__(self) -> None:
        self.lines: deque[str] = deque(maxlen=TAIL_LINES)
        self._partial: dict[str, bytes] = {}

    def feed(self, stream: str, data: bytes) -> None:
        """Add ``data`` read from ``stream`` (lines end at ``\\n``; an unended one waits)."""
        *complete, rest = (self._partial.get(stream, b"") + data).split(b"\n")
        self.lines.extend(_visible(line) for line in complete[-TAIL_LINES:])
        self._partial[stream] = rest[-4 * LINE_CHARS :]

    def last_line(self) -> str | None:
        """The meaningful last line, an unended one included (a rank that hung mid-line)."""
        unended = [_visible(p) for p in self._partial.values() if p.strip()]
        return meaningful_line([*self.lines, *unended])


class OutputRelay:
    """The launcher's side: the pipes of ``nproc`` local ranks in ``folder``, copied to
    ``stdout`` and ``stderr`` by a thread from :meth:`start` to :meth:`close`."""

    def __init__(self, folder: Path, nproc: int, stdout: BinaryIO, stderr: BinaryIO) -> None:
        self.tails = {rank: OutputTail() for rank in range(nproc)}
        self._targets = {"stdout": stdout, "stderr": stderr}
        self._selector = selectors.DefaultSelector()
        self._keep_open: list[int] = []  # our own write ends: no EOF while ranks restart
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        for rank in range(nproc):
            for name in _STREAMS:
                path = output_pipe(folder, rank, name)
                os.mkfifo(path, 0o600)
                fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
                self._keep_open.append(os.open(path, os.O_WRONLY | os.O_NONBLOCK))
                self._selector.register(fd, selectors.EVENT_READ, (rank, name))

    @classmethod
    def open(
        cls, folder: Path, nproc: int, stdout: BinaryIO, stderr: BinaryIO
    ) -> OutputRelay | None:
        """A started relay, or None where named pipes are not available (the ranks then
        write to the launcher's streams directly)."""
        if not hasattr(os, "mkfifo"):
            return None
        try:
            relay = cls(folder, nproc, stdout, stderr)
        except OSError:
            return None
        relay._thread = threading.Thread(target=relay._run, name="hyper-train-relay", daemon=True)
        relay._thread.start()
        return relay

    def last_line(self, local_rank: int) -> str | None:
        """Local rank ``local_rank``'s meaningful last line (:meth:`OutputTail.last_line`)."""
        tail = self.tails.get(local_rank)
        return tail.last_line() if tail is not None else None

    def close(self) -> None:
        """Copy what the pipes still hold, then stop (a writer left behind, such as an
        orphaned data worker, is not waited for)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self._drain()
        for fd in self._keep_open:
            os.close(fd)
        for key in list(self._selector.get_map().values()):
            self._selector.unregister(key.fd)
            os.close(key.fd)
        self._selector.close()

    def _run(self) -> None:
        while not self._stop.is_set():
            for key, _ in self._selector.select(timeout=0.2):
                self._copy(key.fd, *key.data)

    def _drain(self) -> None:
        for key in list(self._selector.get_map().values()):
            while self._copy(key.fd, *key.data):
                pass

    def _copy(self, fd: int, rank: int, stream: str) -> bool:
        """Copy one read of ``fd``; whether it read anything."""
        try:
            data = os.read(fd, 65536)
        except (BlockingIOError, InterruptedError):
            return False
        if not data:
            return False
        self.tails[rank].feed(stream, data)
        target = self._targets[stream]
        with contextlib.suppress(OSError, ValueError):
            target.write(data)
            target.flush()
        return True


def output_pipe(folder: Path, local_rank: int, stream: str) -> Path:
    """The named pipe of a local rank's ``stdout`` or ``stderr`` in the launcher's folder."""
    return folder / f"output-{local_rank}.{stream}"


def connect_output() -> bool:
    """On a rank the launcher started: send this process's stdout and stderr (file
    descriptors 1 and 2, so data workers and native code too) to the launcher's relay;
    whether they were. A stderr that was a terminal is remembered in :data:`RELAYED_TTY_ENV`."""
    folder = os.environ.get(STATUS_DIR_ENV)
    if not folder or "LOCAL_RANK" not in os.environ:
        return False
    local_rank = int(os.environ["LOCAL_RANK"])
    paths = [output_pipe(Path(folder), local_rank, name) for name in _STREAMS]
    try:
        if not all(stat.S_ISFIFO(p.stat().st_mode) for p in paths):
            return False
        fds = [os.open(p, os.O_WRONLY | os.O_NONBLOCK) for p in paths]
    except OSError:
        return False
    if sys.stderr.isatty():
        os.environ[RELAYED_TTY_ENV] = "1"
    for target, (fd, stream) in enumerate(zip(fds, (sys.stdout, sys.stderr), strict=True), 1):
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
        os.set_blocking(fd, True)  # a full pipe waits for the relay, as a terminal would
        os.dup2(fd, target)
        os.close(fd)
    return True
