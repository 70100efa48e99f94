"""Several data sources as one sequence: globs expanded, files concatenated, weights mixed.

``[data] train`` may list sources; a source's path may be a glob. The files are read one after
the other (each stays lazy, with its own ``file:line`` provenance), then the mixing weights
select the sample *slots* of an epoch:

* each file of ``n`` samples of a source with weight ``w`` fills
  ``floor(w) * n + round(frac(w) * n)`` slots: every sample ``floor(w)`` times, then a subset
  of ``round(frac(w) * n)`` of its samples (in file order), drawn by
  ``numpy.random.default_rng((seed, file number))`` (files numbered across all sources);
* the slots are fixed for the run: the sampler shuffles them each epoch and its checkpointed
  position resumes exactly, as for a single file.

A weight of at least 1 never drops a sample; a weight below 1 keeps the same subset every
epoch (a weight asks for it, so nothing is dropped silently). No torch here.
"""

from __future__ import annotations

import glob
import math
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import overload

import numpy as np

from ..errors import ConfigError
from .jsonl import RawSample

_GLOB_CHARS = "*?["


def expand_path(path: str, base_dir: Path, where: str) -> list[str]:
    """``path`` itself (also when it exists as written, e.g. ``a[1].jsonl``), or the files its
    glob matches (sorted, absolute; ``**`` recurses).

    A glob that matches nothing is a :class:`ConfigError` at ``WHERE.path``.
    """
    if not any(c in path for c in _GLOB_CHARS):
        return [path]
    pattern = Path(path).expanduser()
    if not pattern.is_absolute():
        pattern = base_dir / pattern
    if pattern.exists():
        return [path]
    matches = sorted(glob.glob(str(pattern), recursive=True))
    if not matches:
        raise ConfigError([(f"{where}.path", f"no file matches {str(pattern)!r}")])
    return matches


class Concat(Sequence[RawSample]):
    """The samples of ``parts`` one after the other; slicing gives a view."""

    def __init__(self, parts: Sequence[Sequence[RawSample]]) -> None:
        self.parts = list(parts)
        self.offsets = np.cumsum([0, *(len(p) for p in self.parts)], dtype=np.int64)

    def __len__(self) -> int:
        return int(self.offsets[-1])

    @overload
    def __getitem__(self, index: int) -> RawSample: ...

    @overload
    def __getitem__(self, index: slice) -> Indexed: ...

    def __getitem__(self, index: int | slice) -> RawSample | Indexed:
        if isinstance(index, slice):
            return Indexed(self, np.arange(len(self), dtype=np.int64)[index])
        n = len(self)
        if not -n <= index < n:
            raise IndexError(f"sample index {index} out of range ({n} samples)")
        index %= n
        part = int(np.searchsorted(self.offsets, index, side="right")) - 1
        return self.parts[part][index - int(self.offsets[part])]

    def __iter__(self) -> Iterator[RawSample]:
        for part in self.parts:
            yield from part


class Indexed(Sequence[RawSample]):
    """``base[indices[i]]`` for each ``i``; slicing gives another view."""

    def __init__(self, base: Sequence[RawSample], indices: np.ndarray) -> None:
        self.base = base
        self.indices = indices

    def __len__(self) -> int:
        return len(self.indices)

    @overload
    def __getitem__(self, index: int) -> RawSample: ...

    @overload
    def __getitem__(self, index: slice) -> Indexed: ...

    def __getitem__(self, index: int | slice) -> RawSample | Indexed:
        if isinstance(index, slice):
            return Indexed(self.base, self.indices[index])
        return self.base[int(self.indices[index])]

    def __iter__(self) -> Iterator[RawSample]:
        for i in range(len(self)):
            yield self[i]


def mixing_slots(lengths: Sequence[int], weights: Sequence[float], seed: int) -> np.ndarray:
    """The indices into the concatenated sources of an epoch's sample slots (module doc)."""
    slots: list[np.ndarray] = []
    offset = 0
    for k, (n, weight) in enumerate(zip(lengths, weights, strict=True)):
        whole = math.floor(weight)
        extra = round((weight - whole) * n)
        local = [np.arange(n, dtype=np.int64)] * whole
        if extra:
            rng = np.random.default_rng((seed, k))
            local.append(np.sort(rng.permutation(n)[:extra]).astype(np.int64))
        slots.extend(part + offset for part in local)
        offset += n
    return np.concatenate(slots) if slots else np.zeros(0, dtype=np.int64)


def mix(
    parts: Sequence[Sequence[RawSample]], weights: Sequence[float], seed: int
) -> Sequence[RawSample]:
    """``parts`` as one sequence: the part itself when there is one of weight 1, their
    concatenation when every weight is 1, else the weighted slots of :func:`mixing_slots`."""
    if len(parts) == 1 and weights[0] == 1.0:
        return parts[0]
    joined = Concat(parts)
    if all(w == 1.0 for w in weights):
        return joined
    return Indexed(joined, mixing_slots([len(p) for p in parts], weights, seed))
