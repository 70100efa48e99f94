"""The ``parquet`` and ``hf`` dataset formats: Arrow rows read lazily by index (no torch here).

A row is a raw sample with the conversation schema of the JSON formats (``messages``, LLaVA
``conversations`` with ``image``/``images``, ...); its ``_source`` is ``{"file", "index"}``
(0-based row). Images may be paths or the ``{"bytes": ..., "path": ...}`` struct of Hugging
Face ``datasets`` (see :func:`~hyper_core.data.conversation.load_image`).

Files are memory-mapped. Parquet is read one row group at a time (the last one is kept per
process), so random access costs a row group per sample outside it: write image data sets with
small row groups (``datasets`` writes 100 rows per group when there are images). A ``hf``
directory (``datasets.save_to_disk``) holds Arrow stream files, mapped whole: a row costs
only its own bytes. Only a row is converted to Python, never the table.

``pyarrow`` is the optional extra ``hyper-train[parquet]``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import attrs
import numpy as np

from ..config.fields import at_least, meta
from ..errors import ConfigError, DataError, UserError
from .file_rows import FileRows, file_key
from .jsonl import SOURCE_KEY, RawSample

if TYPE_CHECKING:
    import pyarrow

INSTALL = "pip install 'hyper-train[parquet]'"


def import_pyarrow() -> Any:
    """``pyarrow`` with its Parquet and IPC modules, or a one-line :class:`UserError`."""
    try:
        import pyarrow
        import pyarrow.ipc
        import pyarrow.parquet
    except ImportError:
        raise UserError(f"reading Parquet/Arrow data needs pyarrow: {INSTALL}") from None
    return pyarrow


class ArrowRows(FileRows):
    """The rows of one Parquet file (``kind="parquet"``) or Arrow stream file
    (``kind="arrow"``) as raw samples, converted on access; slicing gives a view.

    Pickles as its path and file state; each process maps the file again on first access.
    """

    def __init__(self, path: str | Path, kind: str = "parquet") -> None:
        self._path = Path(path).resolve()
        self._file = str(self._path)
        self._kind = kind
        self._key = file_key(self._path)
        self._pid = -1
        self._open()
        self._rows = range(int(self._offsets[-1]))

    def _open(self) -> None:
        pa = import_pyarrow()
        self._check_unchanged()
        source = pa.memory_map(self._file, "r")
        try:
            if self._kind == "parquet":
                self._reader: Any = pa.parquet.ParquetFile(source)
                counts = [
                    self._reader.metadata.row_group(i).num_rows
                    for i in range(self._reader.num_row_groups)
                ]
            else:
                self._reader = pa.ipc.open_stream(source).read_all()  # mapped, not copied
                counts = [len(self._reader)]
        except (pa.ArrowInvalid, OSError) as exc:
            raise DataError(f"{self._file}: not a readable {self._kind} file ({exc})") from None
        self._offsets = np.cumsum([0, *counts], dtype=np.int64)
        self._group: tuple[int, pyarrow.Table] | None = None
        self._pid = os.getpid()

    def _read(self, row: int) -> RawSample:
        if self._pid != os.getpid():  # a forked or unpickled copy maps the file itself
            self._open()
        if self._kind == "parquet":
            group = int(np.searchsorted(self._offsets, row, side="right")) - 1
            if self._group is None or self._group[0] != group:
                self._group = (group, self._reader.read_row_group(group))
            table, local = self._group[1], row - int(self._offsets[group])
        else:
            table, local = self._reader, row
        (sample,) = table.slice(local, 1).to_pylist()
        sample[SOURCE_KEY] = {"file": self._file, "index": row}
        return sample

    def __getstate__(self) -> dict[str, Any]:
        state = {k: v for k, v in self.__dict__.items() if k not in ("_reader", "_group")}
        state["_pid"] = -1
        return state


@attrs.frozen(kw_only=True)
class ParquetOptions:
    """Options of the ``parquet`` and ``hf`` formats."""

    max_samples: int | None = attrs.field(
        default=None, validator=at_least(1), metadata=meta("Keep the first N samples.")
    )


def _resolve(path: str | None, base_dir: str | Path | None, fmt: str) -> Path:
    if not path:
        raise ConfigError([("$.data.train.path", f"format {fmt!r} needs a path")])
    resolved = Path(path).expanduser()
    if not resolved.is_absolute() and base_dir is not None:
        resolved = Path(base_dir) / resolved
    return resolved


def _limited(samples: Sequence[RawSample], options: ParquetOptions) -> Sequence[RawSample]:
    return samples[: options.max_samples] if options.max_samples is not None else samples


def load_parquet_format(
    path: str | None,
    options: ParquetOptions | None = None,
    base_dir: str | Path | None = None,
) -> Sequence[RawSample]:
    """The ``parquet`` format: one Parquet file (a glob is expanded before, into one source per
    file) or a directory of them (its ``*.parquet`` files, recursively, in sorted order, as
    Spark and ``pandas`` write a partitioned table), rows read lazily."""
    from .sources import Concat

    import_pyarrow()
    options = options or ParquetOptions()
    resolved = _resolve(path, base_dir, "parquet")
    if not resolved.is_dir():
        return _limited(ArrowRows(resolved, "parquet"), options)
    files = sorted(f for f in resolved.rglob("*.parquet") if f.is_file())
    if not files:
        raise DataError(f"{resolved}: a directory without *.parquet files")
    parts = [ArrowRows(f, "parquet") for f in files]
    return _limited(parts[0] if len(parts) == 1 else Concat(parts), options)


def load_hf_format(
    path: str | None,
    options: ParquetOptions | None = None,
    base_dir: str | Path | None = None,
) -> Sequence[RawSample]:
    """The ``hf`` format: a directory written by ``datasets.save_to_disk`` (its
    ``state.json`` lists the Arrow files), read without the ``datasets`` package."""
    from .sources import Concat

    import_pyarrow()
    directory = _resolve(path, base_dir, "hf")
    state_file = directory / "state.json"
    if not state_file.is_file():
        raise DataError(f"{directory}: not a datasets.save_to_disk directory (no state.json)")
    try:
        files = [entry["filename"] for entry in json.loads(state_file.read_text())["_data_files"]]
    except (ValueError, KeyError, TypeError) as exc:
        raise DataError(f"{state_file}: no list of data files ({exc!r})") from None
    parts = [ArrowRows(directory / name, "arrow") for name in files]
    return _limited(parts[0] if len(parts) == 1 else Concat(parts), options or ParquetOptions())
