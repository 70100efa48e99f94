"""Token-budget micro-batches: ``[data] max_tokens_per_micro_batch`` (packed batching only).

A step keeps ``global_batch_size`` samples. Its samples are shared among the data-parallel
ranks by tokens (:func:`assign_to_ranks`), then each rank packs its share into micro-batches
of at most the budget's tokens (:func:`pack_by_tokens`), so the number of micro-batches per
step varies by rank (``Lockstep`` pads the ranks with fewer). The loss stays normalised by the
step's global count of loss tokens, so the grouping changes no result.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from typing import TYPE_CHECKING

from ..errors import ConfigError

if TYPE_CHECKING:
    from .base import BatchingRuntime
    from .types import MicroBatch, SampleFeatures

#: The runtimes that lay a micro-batch out as one row of its tokens (no padding per sample).
TOKEN_BUDGET_RUNTIMES = ("packed",)


def pack_by_tokens(
    lengths: Sequence[int], max_tokens: int, max_samples: int | None = None
) -> list[list[int]]:
    """Group positions into micro-batches of at most ``max_tokens`` tokens (and at most
    ``max_samples`` samples): first-fit decreasing, ties by position; each group lists its
    positions in ascending order, groups ordered by their first position.

    A sample longer than ``max_tokens`` gets a micro-batch of its own (never dropped; the
    transform's ``max_seq_len`` limit normally rejects such samples first).
    """
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    groups: list[list[int]] = []
    totals: list[int] = []
    for i in order:
        for g, total in enumerate(totals):
            full = max_samples is not None and len(groups[g]) >= max_samples
            if not full and total + lengths[i] <= max_tokens:
                groups[g].append(i)
                totals[g] += lengths[i]
                break
        else:
            groups.append([i])
            totals.append(lengths[i])
    return sorted((sorted(g) for g in groups), key=lambda g: g[0])


def assign_to_ranks(lengths: Sequence[int], world_size: int) -> list[list[int]]:
    """Share positions among ``world_size`` ranks with balanced token totals: longest first,
    each to the rank with the fewest tokens so far (then fewest samples, then lowest rank).
    Every rank gets a sample while there are at least ``world_size``; each rank's positions
    are in ascending order. Deterministic: every rank computes the same plan."""
    heap = [(0, 0, r) for r in range(world_size)]
    shares: list[list[int]] = [[] for _ in range(world_size)]
    for i in sorted(range(len(lengths)), key=lambda i: (-lengths[i], i)):
        tokens, count, rank = heapq.heappop(heap)
        shares[rank].append(i)
        heapq.heappush(heap, (tokens + lengths[i], count + 1, rank))
    return [sorted(share) for share in shares]


def check_token_budget(batching: str, max_tokens: int | None) -> None:
    """:class:`ConfigError` when ``max_tokens`` is set but runtime ``batching`` is not packed."""
    if max_tokens is not None and batching not in TOKEN_BUDGET_RUNTIMES:
        raise ConfigError(
            [
                (
                    "$.data.max_tokens_per_micro_batch",
                    f"needs packed batching, but this run batches {batching!r}; set "
                    '[data] batching = "packed" or remove max_tokens_per_micro_batch',
                )
            ]
        )


class TokenBudgetCollate:
    """A packed runtime's collate with micro-batches filled up to ``max_tokens`` tokens and at
    most ``micro_batch_size`` samples, instead of a fixed ``micro_batch_size`` samples (a
    vision filler, see :meth:`BatchingRuntime.with_filler`, comes on top, as padding)."""

    def __init__(self, runtime: BatchingRuntime, max_tokens: int) -> None:
        check_token_budget(runtime.name, max_tokens)
        self.runtime = runtime
        self.max_tokens = max_tokens

    def __call__(self, features: Sequence[SampleFeatures]) -> list[MicroBatch]:
        groups = pack_by_tokens(
            [f.length for f in features], self.max_tokens, self.runtime.options.micro_batch_size
        )
        return [self.runtime.with_filler([features[i] for i in group]) for group in groups]
