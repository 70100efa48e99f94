"""The rows of one data file, read when used: the base of the lazy readers (JSON lines,
Parquet/Arrow).

A subclass sets :attr:`_path`, :attr:`_file`, :attr:`_key` (:func:`file_key`) and
:attr:`_rows` and implements :meth:`_read`; slicing gives a view of the same file (the selected
rows as a ``range``, so views pickle small), whose per-process state :meth:`_fresh` resets.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TypeVar, overload

from ..errors import DataError
from .jsonl import RawSample

Self = TypeVar("Self", bound="FileRows")


def file_key(path: Path) -> tuple[int, int]:
    """``(size, mtime_ns)`` of a data file: what its cached state is keyed on."""
    try:
        stat = path.stat()
    except FileNotFoundError:
        raise DataError(f"data file not found: {path}") from None
    if not path.is_file():
        raise DataError(f"data path is a directory, expected a file: {path}")
    return stat.st_size, stat.st_mtime_ns


class FileRows(Sequence[RawSample]):
    """A lazily read file's samples; see the module doc."""

    _path: Path
    _file: str
    _key: tuple[int, int]
    _rows: range

    @property
    def file(self) -> str:
        """The resolved path of the data file."""
        return self._file

    def __len__(self) -> int:
        return len(self._rows)

    @overload
    def __getitem__(self, index: int) -> RawSample: ...

    @overload
    def __getitem__(self: Self, index: slice) -> Self: ...

    def __getitem__(self: Self, index: int | slice) -> RawSample | Self:
        if isinstance(index, slice):
            view = object.__new__(type(self))
            view.__dict__.update(self.__dict__)
            view._rows = self._rows[index]
            self._fresh(view)
            return view
        return self._read(self._rows[index])

    def __iter__(self) -> Iterator[RawSample]:
        for i in range(len(self)):
            yield self[i]

    def _read(self, row: int) -> RawSample:
        """Row ``row`` of the file as a raw sample (with its provenance)."""
        raise NotImplementedError

    def _fresh(self, view: FileRows) -> None:
        """Reset what a new view must not share with this one (open handles)."""

    def _check_unchanged(self) -> None:
        """A :class:`DataError` when the file changed since it was first read."""
        if file_key(self._path) != self._key:
            raise DataError(f"{self._file}: the data file changed while training read it")
