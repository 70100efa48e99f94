"""Ranks run the same number of forwards, so that the collectives inside them stay matched."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Generic, TypeVar

import attrs

if TYPE_CHECKING:
    from ..parallel.env import DistEnv

MicroBatch = TypeVar("MicroBatch")


class NoFillerError(RuntimeError):
    """A rank must pad its schedule but has never seen a micro-batch to repeat."""


@attrs.define
class Lockstep(Generic[MicroBatch]):
    """Pads this rank's micro-batches to the most any rank has, with zero-weight repeats.

    A sharded model (FSDP2) or a parallel vision encoder runs collectives in every forward:
    a rank with fewer micro-batches (token-budget packing, an uneven last eval shard) would
    leave the others waiting. The padding repeats this rank's last real micro-batch, or, for a
    rank with none this time, the last one it ran before (a training one for an empty eval
    shard). One object per run, shared by the train step and evaluation.
    """

    dist: DistEnv
    _last: MicroBatch | None = attrs.field(default=None, init=False)

    def schedule(self, micro_batches: Sequence[MicroBatch]) -> list[tuple[MicroBatch, float]]:
        """``(micro_batch, weight)`` pairs: the real ones (weight 1), then the padding (weight
        0) up to the largest count of any rank. A collective: every rank calls it together."""
        target = self.dist.max_int(len(micro_batches))
        if micro_batches:
            self._last = micro_batches[-1]
        schedule = [(mb, 1.0) for mb in micro_batches]
        missing = target - len(schedule)
        if missing:
            if self._last is None:
                raise NoFillerError("a rank has no usable sample in its first step; add data")
            schedule += [(self._last, 0.0)] * missing
        return schedule
