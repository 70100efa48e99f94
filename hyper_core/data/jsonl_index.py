"""A JSON-lines file read lazily through a cached index of line offsets (no torch here).

:class:`JsonlFile` is a sequence of raw samples equal, sample for sample, to what
:func:`~hyper_core.data.jsonl.read_jsonl` returns for the same file (same order, same
``_source``, same deferred errors), but a sample is parsed only when it is indexed.

The index is one ``int64`` array of rows ``(start, end, line)`` per non-blank line (``end``
excludes the ``\\n`` and one trailing ``\\r``; ``line`` is 1-based), built once by a streaming
scan and cached as ``.npy`` under ``$HYPER_TRAIN_CACHE/jsonl_index``, keyed by the resolved
path, size and ``mtime_ns``. The cached index is memory-mapped read-only: ranks on one node
share its pages through the page cache, and forked workers share them too (nothing writes
to it, so no page is copied).
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import IO, Any

import numpy as np

from .file_rows import FileRows, file_key
from .jsonl import _BOM, DEFAULT_MAX_LINE_BYTES, RawSample, parse_line, too_long

#: Bumped when the index layout changes (old cache files are then ignored).
INDEX_VERSION = 1
#: Bytes read per step of the scan; bounds the scan's memory.
SCAN_CHUNK_BYTES = 1 << 20

# bytes.strip() whitespace: a line of only these is blank.
_WHITESPACE = np.zeros(256, dtype=bool)
_WHITESPACE[list(b" \t\n\r\x0b\x0c")] = True
_NEWLINE, _CR = ord("\n"), ord("\r")


def scan_lines(path: Path, *, chunk_bytes: int = SCAN_CHUNK_BYTES) -> np.ndarray:
    """The ``(n, 3)`` index ``(start, end, line)`` of the non-blank lines of ``path``.

    Reads ``chunk_bytes`` at a time; splits on ``\\n`` only, as ``read_jsonl`` does.
    """
    rows: list[np.ndarray] = []
    with open(path, "rb") as handle:
        head = handle.read(len(_BOM))
        offset = len(_BOM) if head == _BOM else 0
        handle.seek(offset)
        line_start, line_no, seen_text, prev_byte = offset, 1, False, 0
        while chunk := handle.read(chunk_bytes):
            data = np.frombuffer(chunk, dtype=np.uint8)
            newlines = np.flatnonzero(data == _NEWLINE)
            text = ~_WHITESPACE[data]
            if newlines.size:
                local_starts = np.concatenate(([0], newlines[:-1] + 1))
                # one segment per line with its \n: any non-whitespace byte makes it non-blank
                has_text = np.logical_or.reduceat(text[: newlines[-1] + 1], local_starts)
                has_text[0] |= seen_text
                starts = np.concatenate(([line_start], newlines[:-1] + 1 + offset))
                ends = newlines + offset
                before_nl = np.where(newlines > 0, data[newlines - 1], 0)
                if newlines[0] == 0:
                    before_nl[0] = prev_byte
                ends -= ((before_nl == _CR) & (ends > starts)).astype(np.int64)
                lines = np.arange(line_no, line_no + newlines.size, dtype=np.int64)
                rows.append(np.stack([starts, ends, lines], axis=1)[has_text])
                line_no += newlines.size
                line_start = int(newlines[-1]) + 1 + offset
                seen_text = bool(text[newlines[-1] + 1 :].any())
            else:
                seen_text = seen_text or bool(text.any())
            prev_byte = int(data[-1])
            offset += len(chunk)
        if seen_text:  # a last line without its \n
            end = offset - 1 if prev_byte == _CR and offset > line_start else offset
            rows.append(np.array([[line_start, end, line_no]], dtype=np.int64))
    if not rows:
        return np.zeros((0, 3), dtype=np.int64)
    return np.concatenate(rows).astype(np.int64, copy=False)


def _cache_dir() -> Path:
    from .cache import cache_root

    return cache_root() / "jsonl_index"


def _cache_path(cache_dir: Path, file: str, key: tuple[int, int]) -> Path:
    path_digest = hashlib.sha256(file.encode()).hexdigest()[:16]
    return cache_dir / f"{path_digest}-v{INDEX_VERSION}-{key[0]}-{key[1]}.npy"


def load_index(
    path: Path, key: tuple[int, int], cache_dir: Path | None = None
) -> tuple[np.ndarray, bool]:
    """The index of ``path`` (file state ``key``) and whether it is cached on disk.

    Reads the cache (memory-mapped) or scans and writes it atomically, dropping the stale
    indexes of the same file. An unwritable cache directory only costs a scan per process.
    """
    cache_dir = _cache_dir() if cache_dir is None else cache_dir
    cached = _cache_path(cache_dir, str(path), key)
    if cached.is_file():
        try:
            return np.load(cached, mmap_mode="r", allow_pickle=False), True
        except (OSError, ValueError):  # truncated or foreign: rebuild it
            pass
    index = scan_lines(path)
    try:
        cache_dir.mkdir(parents=True, exist_ok=True)
        tmp = cached.with_name(f".{cached.name}.tmp-{os.getpid()}")
        with open(tmp, "wb") as handle:
            np.save(handle, index, allow_pickle=False)
        os.replace(tmp, cached)
    except OSError:
        return index, False
    prefix = cached.name.split("-", 1)[0] + "-"
    for stale in cache_dir.glob(f"{prefix}*.npy"):
        if stale != cached:
            stale.unlink(missing_ok=True)
    return index, True


class JsonlFile(FileRows):
    """The samples of one JSON-lines file, parsed on access; slicing gives another view.

    Pickles small (path, file state and the selected rows as a ``range``): the unpickled copy
    memory-maps the cached index again and opens the file on first access in its process.
    """

    def __init__(
        self,
        path: str | Path,
        *,
        max_line_bytes: int = DEFAULT_MAX_LINE_BYTES,
        cache_dir: str | Path | None = None,
    ) -> None:
        resolved = Path(path).resolve()
        self._path = resolved
        self._file = str(resolved)
        self._key = file_key(resolved)
        self._max_line_bytes = max_line_bytes
        self._cache_dir = Path(cache_dir) if cache_dir is not None else None
        self._index, self._cached = load_index(resolved, self._key, self._cache_dir)
        self._rows = range(len(self._index))
        self._handle: IO[bytes] | None = None
        self._pid = -1

    def _fresh(self, view: FileRows) -> None:
        view._handle, view._pid = None, -1  # type: ignore[attr-defined]

    def _read(self, row: int) -> RawSample:
        start, end, line = (int(v) for v in self._index[row])
        source = {"file": self._file, "line": line}
        if end - start > self._max_line_bytes:
            return too_long(end - start, source, self._max_line_bytes)
        handle = self._open()
        handle.seek(start)
        raw = handle.read(end - start)
        return parse_line(raw, source, max_line_bytes=self._max_line_bytes)

    def _open(self) -> IO[bytes]:
        if self._handle is None or self._pid != os.getpid():  # a forked child opens its own
            self._check_unchanged()
            self._handle = open(self._path, "rb")
            self._pid = os.getpid()
        return self._handle

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_handle"], state["_pid"] = None, -1
        if self._cached:
            state["_index"] = None
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        if self._index is None:
            self._index, self._cached = load_index(self._path, self._key, self._cache_dir)

    def __del__(self) -> None:
        handle = getattr(self, "_handle", None)
        if handle is not None and self._pid == os.getpid():
            handle.close()
