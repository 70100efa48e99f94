"""Grouping samples by tokens: token-budget micro-batches (``[data]
max_tokens_per_micro_batch``, packed batching only) and length-grouped steps (``[data]
buffer_size``).

A step keeps ``global_batch_size`` samples. Its samples are shared among the data-parallel
ranks by tokens (:func:`assign_to_ranks`), then each rank packs its share into micro-batches
of at most the budget's tokens (:func:`pack_by_tokens`), so the number of micro-batches per
step varies by rank (``Lockstep`` pads the ranks with fewer). The loss stays normalised by the
step's global count of loss tokens, so the grouping changes no result.

With a look-ahead buffer of several steps (:class:`StepPlanner`), the buffer's samples are
first regrouped into as many steps: of similar lengths (:func:`group_steps_by_length`), so a
fixed-size micro-batch needs less padding; or, with a budget, whichever of a few plans needs
the fewest forwards (:func:`fill_steps_to_budget`: step totals just under a multiple of
``ranks × budget``, so the last micro-batch of each rank is not left half empty).
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from typing import TYPE_CHECKING

import attrs

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


def group_steps_by_length(lengths: Sequence[int | None], step_size: int) -> list[list[int]]:
    """Regroup a buffer of whole steps (``len(lengths)`` a multiple of ``step_size``) into as
    many steps of similar lengths: the usable positions (length not None) sorted by
    ``(length, position)`` and cut into consecutive runs whose sizes differ by at most one
    (the runs of shorter samples take the extra ones), each run topped up to ``step_size``
    with the unusable positions in order. Steps come shortest first; each lists its positions
    in ascending order, so a rank's contiguous slice of a step is no longer in length order.
    Every position is in exactly one step."""
    if step_size < 1 or len(lengths) % step_size:
        raise ValueError(f"{len(lengths)} positions are not whole steps of {step_size}")
    steps = len(lengths) // step_size
    usable = sorted(
        (i for i, n in enumerate(lengths) if n is not None), key=lambda i: (lengths[i], i)
    )
    groups: list[list[int]] = []
    taken = 0
    for size in _usable_per_step(lengths, steps):
        groups.append(usable[taken : taken + size])
        taken += size
    return _top_up(groups, lengths, step_size)


def fill_steps_to_budget(
    lengths: Sequence[int | None],
    step_size: int,
    world_size: int,
    max_tokens: int,
    fill_percent: int = 100,
) -> list[list[int]]:
    """Regroup a buffer of whole steps into as many steps whose token totals come close under
    a multiple of ``world_size × max_tokens × fill_percent / 100``: the buffer needs ``n`` such
    units, shared among its steps as evenly as possible, and each usable position, longest
    first, goes to the step (of those with room for another sample) with the most tokens left
    to its target. Each step gets as many usable positions as :func:`group_steps_by_length`
    gives it, topped up with the unusable ones; positions in ascending order."""
    if step_size < 1 or len(lengths) % step_size:
        raise ValueError(f"{len(lengths)} positions are not whole steps of {step_size}")
    steps = len(lengths) // step_size
    usable = [i for i, n in enumerate(lengths) if n is not None]
    unit = max(1, world_size * max_tokens * fill_percent // 100)
    total = sum(lengths[i] or 0 for i in usable)
    units = max(steps, -(-total // unit))
    base, extra = divmod(units, steps)
    caps = _usable_per_step(lengths, steps)
    groups: list[list[int]] = [[] for _ in range(steps)]
    # (-tokens left to the target, step): the step with the most left first, then the lowest.
    heap = [(-(base + (j < extra)) * unit, j) for j in range(steps) if caps[j]]
    heapq.heapify(heap)
    for i in sorted(usable, key=lambda i: (-(lengths[i] or 0), i)):
        left, j = heapq.heappop(heap)
        groups[j].append(i)
        if len(groups[j]) < caps[j]:
            heapq.heappush(heap, (left + (lengths[i] or 0), j))
    return _top_up(groups, lengths, step_size)


def _usable_per_step(lengths: Sequence[int | None], steps: int) -> list[int]:
    """Usable positions per step: as even as possible, the first steps one more."""
    base, extra = divmod(sum(n is not None for n in lengths), steps)
    return [base + (j < extra) for j in range(steps)]


def _top_up(
    groups: list[list[int]], lengths: Sequence[int | None], step_size: int
) -> list[list[int]]:
    """Each group filled to ``step_size`` with the unusable positions in order, then sorted."""
    unusable = iter([i for i, n in enumerate(lengths) if n is None])
    return [sorted(g + [next(unusable) for _ in range(step_size - len(g))]) for g in groups]


@attrs.frozen
class StepPlanner:
    """How a look-ahead buffer of whole steps (``[data] buffer_size``) is regrouped into as
    many steps: by length without a budget; with ``max_tokens``, the plan with the fewest
    forwards (``ranks ×`` the most micro-batches of a rank, summed over the steps; then the
    fewest micro-batches) among the buffer as read, by length, and filled to 100/98/96% of the
    budget, ties to the first. The loader and ``data stats`` make the same plan."""

    step_size: int
    world_size: int = 1
    max_tokens: int | None = None
    max_samples: int | None = None

    def __call__(self, lengths: Sequence[int | None]) -> list[list[int]]:
        """The buffer's steps, as lists of its positions in ascending order."""
        if self.max_tokens is None:
            return group_steps_by_length(lengths, self.step_size)
        g = self.step_size
        candidates = [
            [list(range(j, j + g)) for j in range(0, len(lengths), g)],
            group_steps_by_length(lengths, g),
            *(
                fill_steps_to_budget(lengths, g, self.world_size, self.max_tokens, percent)
                for percent in (100, 98, 96)
            ),
        ]
        return min(candidates, key=lambda plan: self.cost(lengths, plan))

    def cost(self, lengths: Sequence[int | None], plan: list[list[int]]) -> tuple[int, int]:
        """``(forwards, micro-batches)`` of ``plan`` under the budget: each step's usable
        samples shared among the ranks by tokens and packed, as the loader does."""
        assert self.max_tokens is not None
        forwards = micro_batches = 0
        for step in plan:
            usable = [n for n in (lengths[i] for i in step) if n is not None]
            counts = [
                len(pack_by_tokens([usable[i] for i in share], self.max_tokens, self.max_samples))
                for share in assign_to_ranks(usable, self.world_size)
            ]
            forwards += max(counts) * self.world_size
            micro_batches += sum(counts)
        return forwards, micro_batches


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
