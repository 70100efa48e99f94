"""The step loader: one item per optimizer step, sharded by rank, resumable, deterministic.

Sampling is defined on *global* positions, so the sample sequence depends only on
``(num_samples, global_batch_size, shuffle, seed)``, not on the world size or the number of
workers. In epoch ``e`` the samples are ``randperm(num_samples)`` from
``torch.Generator().manual_seed(seed + e)`` (identity without shuffle); step ``s`` covers global
positions ``[s*G, (s+1)*G)`` and rank ``r`` takes the contiguous slice ``[r*G/W, (r+1)*G/W)``.

With ``balance_ranks`` (token-budget batching) every rank prepares the step's ``G`` samples
and keeps its share of a token-balanced plan instead (:class:`RankShare`): ranks do ``W`` times
the data work of the slices, and get equal tokens, not equal samples. The plan depends only on
the step's samples, so a resumed run continues the same sequence.

With a look-ahead buffer of ``buffer_steps > 1`` steps (``[data] buffer_size``), the epoch's
steps are taken ``buffer_steps`` at a time: every rank prepares the buffer's ``buffer_steps × G``
samples (one DataLoader item), regroups them into as many steps
(:class:`~hyper_core.batching.token_budget.StepPlanner`: of similar lengths, or with a token
budget the plan with the fewest forwards), and runs those steps in an order shuffled with
``(seed, epoch, buffer)`` (:meth:`StepSampler.step_order`); each step is then shared among the
ranks as without a buffer (contiguous slices, or by tokens). Step ``s`` is thus a pure
function of the epoch's order and ``s``: the same set of samples per epoch as without the
buffer, and a resumed run prepares again the buffer it stopped in and continues at ``s``. The
cost: every rank prepares every rank's samples (``W ×`` the data work of its slice), a worker
holds a whole buffer's samples, and the first step waits for a whole buffer.

Workers: with ``num_workers > 0`` the loader uses the ``fork`` start method where available
(Linux): workers start fast and inherit the transform (tokenizer, processor) without pickling
it. Pass ``multiprocessing_context`` to override (``"spawn"``/``"forkserver"`` need a picklable
dataset and collate). ``TOKENIZERS_PARALLELISM`` defaults to ``false`` when workers are used, to
avoid the fork warning/deadlock of HF fast tokenizers. Batches are collated in the workers.

Not enough usable data: training on steps without samples would "succeed" with nothing
learned, so :meth:`StepLoader.__iter__` raises a :class:`DataError` (with the skip counts by
reason) when the training data has fewer usable samples than one global batch. It finds out
by checking the whole dataset in order, in the main process, stopping at the first
``global_batch_size`` usable samples; it checks (once per loader) only on a sign of trouble:

* a step without a usable sample on this rank before any usable sample was seen, or
* an epoch this iterator saw whole that had fewer usable samples on this rank than the local
  batch size.

The verdict depends only on the dataset, so every rank that checks reaches the same one. A
healthy dataset costs nothing (or a few samples prepared twice when the first step is unlucky).
"""

from __future__ import annotations

import math
import multiprocessing
import os
import signal
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import attrs
import torch
import torch.utils.data

from ..batching.token_budget import StepPlanner, TokenBudgetCollate, assign_to_ranks
from ..batching.types import MicroBatch, SampleFeatures
from ..errors import DataError
from .dataset import Skipped
from .errors import SkipCounter

Collate = Callable[[list[SampleFeatures]], list[MicroBatch]]


class StepSampler:
    """Which dataset indices rank ``rank`` gets at each step of each epoch."""

    def __init__(
        self,
        num_samples: int,
        global_batch_size: int,
        rank: int = 0,
        world_size: int = 1,
        shuffle: bool = True,
        seed: int = 0,
        drop_last: bool = True,
    ) -> None:
        if global_batch_size < 1:
            raise ValueError(f"global_batch_size must be >= 1, got {global_batch_size}")
        if world_size < 1 or not 0 <= rank < world_size:
            raise ValueError(f"bad rank {rank} for world size {world_size}")
        if global_batch_size % world_size:
            raise ValueError(
                f"global_batch_size {global_batch_size} is not divisible by the "
                f"world size {world_size}"
            )
        self.num_samples = int(num_samples)
        self.global_batch_size = int(global_batch_size)
        self.rank = rank
        self.world_size = world_size
        self.shuffle = shuffle
        self.seed = int(seed)
        self.drop_last = drop_last
        if drop_last and self.num_samples < self.global_batch_size:
            raise DataError(
                f"the dataset has {self.num_samples} samples, fewer than one global "
                f"batch ({self.global_batch_size}); lower [training] global_batch_size"
            )
        self._perm_cache: tuple[int, list[int]] | None = None

    @property
    def local_batch_size(self) -> int:
        """Samples per rank per full step (``G / W``)."""
        return self.global_batch_size // self.world_size

    @property
    def steps_per_epoch(self) -> int:
        """``num_samples // G`` with ``drop_last``, else rounded up."""
        n, g = self.num_samples, self.global_batch_size
        return n // g if self.drop_last else -(-n // g)

    def permutation(self, epoch: int) -> list[int]:
        """The order of the dataset in ``epoch``."""
        if self._perm_cache is not None and self._perm_cache[0] == epoch:
            return self._perm_cache[1]
        if self.shuffle:
            gen = torch.Generator().manual_seed(self.seed + epoch)
            perm = torch.randperm(self.num_samples, generator=gen).tolist()
        else:
            perm = list(range(self.num_samples))
        self._perm_cache = (epoch, perm)
        return perm

    def step_indices(self, epoch: int, step: int, *, all_ranks: bool = False) -> list[int]:
        """This rank's dataset indices at ``step`` of ``epoch`` (every rank's, in order, with
        ``all_ranks``: rank ``r``'s are the slice :func:`rank_slice` of them)."""
        if not 0 <= step < self.steps_per_epoch:
            raise IndexError(f"step {step} outside 0..{self.steps_per_epoch - 1}")
        begin = step * self.global_batch_size
        size = min(self.global_batch_size, self.num_samples - begin)
        if all_ranks:
            return self.permutation(epoch)[begin : begin + size]
        lo, hi = rank_slice(size, self.rank, self.world_size)
        return self.permutation(epoch)[begin + lo : begin + hi]

    def iter_epoch(
        self, epoch: int, start_step: int = 0, *, all_ranks: bool = False
    ) -> Iterator[list[int]]:
        """This rank's (or every rank's) indices of each step of ``epoch`` from
        ``start_step``."""
        for step in range(start_step, self.steps_per_epoch):
            yield self.step_indices(epoch, step, all_ranks=all_ranks)

    def buffer_indices(self, epoch: int, buffer: int, buffer_steps: int) -> list[int]:
        """Every rank's indices of steps ``[buffer × buffer_steps, (buffer + 1) × buffer_steps)``
        of ``epoch`` (fewer steps in the epoch's last buffer), in order."""
        first = buffer * buffer_steps
        last = min(first + buffer_steps, self.steps_per_epoch)
        if not 0 <= first < last:
            raise IndexError(f"buffer {buffer} of {buffer_steps} steps is outside the epoch")
        g = self.global_batch_size
        return self.permutation(epoch)[first * g : last * g]

    def step_order(self, epoch: int, buffer: int, steps: int) -> list[int]:
        """The order in which a buffer's ``steps`` regrouped steps run: a permutation seeded by
        ``(seed, epoch, buffer)`` (identity without shuffle), so that steps of long and short
        samples alternate at random instead of rising through each buffer."""
        if not self.shuffle:
            return list(range(steps))
        mixed = ((self.seed * 1_000_003 + epoch) * 1_000_003 + buffer) % 2**63
        return torch.randperm(steps, generator=torch.Generator().manual_seed(mixed)).tolist()

    def iter_buffers(self, epoch: int, start_buffer: int, buffer_steps: int) -> Iterator[list[int]]:
        """:meth:`buffer_indices` of each buffer of ``epoch`` from ``start_buffer``."""
        buffers = -(-self.steps_per_epoch // buffer_steps)
        for buffer in range(start_buffer, buffers):
            yield self.buffer_indices(epoch, buffer, buffer_steps)


def rank_slice(size: int, rank: int, world_size: int) -> tuple[int, int]:
    """``[lo, hi)``: rank ``rank``'s contiguous share of a step of ``size`` samples."""
    return (rank * size) // world_size, ((rank + 1) * size) // world_size


class _BatchSampler:
    """The DataLoader's batch sampler: one epoch from a position the StepLoader sets; with
    ``whole_steps`` each step's indices of every rank (the collate picks this rank's); with
    ``buffer_steps > 1`` each buffer's indices of every rank, from the buffer holding the
    start step."""

    def __init__(
        self, sampler: StepSampler, whole_steps: bool = False, buffer_steps: int = 1
    ) -> None:
        self.sampler = sampler
        self.whole_steps = whole_steps
        self.buffer_steps = buffer_steps
        self.epoch = 0
        self.start_step = 0

    def __iter__(self) -> Iterator[list[int]]:
        if self.buffer_steps > 1:
            start = self.start_step // self.buffer_steps
            return self.sampler.iter_buffers(self.epoch, start, self.buffer_steps)
        if self.whole_steps:
            return self.sampler.iter_epoch(self.epoch, self.start_step, all_ranks=True)
        return self.sampler.iter_epoch(self.epoch, self.start_step)

    def __len__(self) -> int:
        steps = self.sampler.steps_per_epoch
        if self.buffer_steps > 1:
            k = self.buffer_steps
            return max(0, -(-steps // k) - self.start_step // k)
        return max(0, steps - self.start_step)


class _Failed:
    """A :class:`DataError` raised while fetching a sample, carried to the main process."""

    def __init__(self, error: DataError) -> None:
        self.error = error


class _CarryDataErrors(torch.utils.data.Dataset):
    """Wraps the dataset so a worker's DataError reaches the main process as itself.

    Otherwise the DataLoader re-raises it with the worker traceback inside the message, and the
    CLI's one-line error would read "Caught DataError in DataLoader worker process 0".
    """

    def __init__(self, dataset: torch.utils.data.Dataset) -> None:
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)  # type: ignore[arg-type]

    def __getitem__(self, index: int) -> Any:
        try:
            return self.dataset[index]
        except DataError as exc:
            return _Failed(exc)


_ALIGN = 64  # bytes; every tensor in a packed step starts at a multiple of this
#: Where a tensor lies in the buffer: offset, dtype, shape.
_Spot = tuple[int, torch.dtype, tuple[int, ...]]
_INPUT_FIELDS = ("model_inputs", "loss_inputs")


@attrs.frozen
class _PackedStep:
    """A step's micro-batches as they leave a worker: every tensor of their ``model_inputs``
    and ``loss_inputs`` in one shared-memory buffer, the rest as it is.

    A tensor that leaves a worker on its own costs the main process an authenticated socket
    connection to fetch its file descriptor (about 0.7 ms each on 2 cores: 5 ms per demo step
    of 7 tensors); one buffer per step costs one.
    """

    buffer: torch.Tensor  # uint8, in shared memory
    #: Per micro-batch, per input field, key → its spot in ``buffer``.
    layout: list[dict[str, dict[str, _Spot]]]
    #: The micro-batches with those tensors set to None.
    stripped: list[MicroBatch]

    @classmethod
    def pack(cls, micro_batches: list[MicroBatch]) -> _PackedStep:
        """Copy the tensors of ``micro_batches`` into one new shared buffer."""
        entries: list[tuple[int, torch.Tensor]] = []
        layout: list[dict[str, dict[str, _Spot]]] = []
        stripped = []
        total = 0
        for mb in micro_batches:
            spots: dict[str, dict[str, _Spot]] = {}
            fields = {}
            for field in _INPUT_FIELDS:
                values = dict(getattr(mb, field))
                spots[field] = {}
                for key, value in values.items():
                    if isinstance(value, torch.Tensor) and value.layout == torch.strided:
                        spots[field][key] = (total, value.dtype, tuple(value.shape))
                        entries.append((total, value))
                        total += -(-value.nbytes // _ALIGN) * _ALIGN
                        values[key] = None
                fields[field] = values
            layout.append(spots)
            stripped.append(attrs.evolve(mb, **fields))
        buffer = torch.empty(total, dtype=torch.uint8).share_memory_()
        for offset, value in entries:
            flat = value.contiguous().reshape(-1).view(torch.uint8)
            buffer[offset : offset + flat.numel()].copy_(flat)
        return cls(buffer, layout, stripped)

    def pin_memory(self) -> _PackedStep:
        """The step in page-locked memory (one copy of the buffer), so that its move to the
        GPU can overlap compute; called by the DataLoader's pinning thread."""
        return attrs.evolve(self, buffer=self.buffer.pin_memory())

    def unpack(self) -> list[MicroBatch]:
        """The micro-batches with their tensors back, as views of the buffer."""
        out = []
        for mb, spots in zip(self.stripped, self.layout, strict=True):
            fields = {}
            for field, keys in spots.items():
                values = dict(getattr(mb, field))
                for key, (offset, dtype, shape) in keys.items():
                    nbytes = math.prod(shape) * dtype.itemsize
                    values[key] = self.buffer[offset : offset + nbytes].view(dtype).view(shape)
                fields[field] = values
            out.append(attrs.evolve(mb, **fields))
        return out


@attrs.frozen
class RankShare:
    """Keep rank ``rank``'s share of a whole step: every rank prepares the step's
    ``global_batch_size`` samples and computes the same plan, balanced by tokens
    (:func:`~hyper_core.batching.token_budget.assign_to_ranks`, token-budget batching) or, with
    ``by_tokens=False``, the contiguous slice (:func:`rank_slice`) it would have prepared alone."""

    rank: int
    world_size: int
    by_tokens: bool = True


#: One step as it leaves the collate: micro-batches, ``reason -> count`` skipped, usable samples.
_Step = tuple[Any, dict[str, int], int]


class _StepCollate:
    """Drops :class:`Skipped` markers, counts them, and calls the runtime's collate; with a
    :class:`RankShare`, first keeps this rank's share of the whole step (each rank counts the
    skipped samples of its contiguous slice, so the counts add up over ranks). With a
    ``planner`` the items are a whole buffer: it returns the list of the planner's steps."""

    def __init__(
        self, collate: Collate, share: RankShare | None = None, planner: StepPlanner | None = None
    ) -> None:
        self.collate = collate
        self.share = share
        self.planner = planner

    def __call__(
        self, items: Sequence[SampleFeatures | Skipped | _Failed]
    ) -> _Step | list[_Step] | _Failed:
        for item in items:
            if isinstance(item, _Failed):
                return item
        if self.planner is None:
            return self._step(items)  # type: ignore[arg-type]
        lengths = [None if isinstance(item, Skipped) else item.length for item in items]
        groups = self.planner(lengths)  # type: ignore[arg-type]
        return [self._step([items[i] for i in group]) for group in groups]  # type: ignore[misc]

    def _step(self, items: Sequence[SampleFeatures | Skipped]) -> _Step:
        features: list[SampleFeatures] = []
        skipped: dict[str, int] = {}
        lo, hi = 0, len(items)
        if self.share is not None:
            lo, hi = rank_slice(len(items), self.share.rank, self.share.world_size)
        for position, item in enumerate(items):
            if isinstance(item, Skipped):
                if lo <= position < hi:
                    skipped[item.reason] = skipped.get(item.reason, 0) + 1
            elif self.share is None or self.share.by_tokens or lo <= position < hi:
                features.append(item)
        if self.share is not None and self.share.by_tokens:
            shares = assign_to_ranks([f.length for f in features], self.share.world_size)
            features = [features[i] for i in shares[self.share.rank]]
        micro_batches: Any = self.collate(features) if features else []
        if micro_batches and torch.utils.data.get_worker_info() is not None:
            micro_batches = _PackedStep.pack(micro_batches)
        return micro_batches, dict(sorted(skipped.items())), len(features)


@attrs.define(kw_only=True)
class StepBatch:
    """One rank's data for one optimizer step."""

    micro_batches: list[MicroBatch]
    #: ``reason -> count`` of this step's skipped samples.
    skipped: dict[str, int]
    #: Usable (not skipped) samples.
    num_samples: int
    epoch: int
    step_in_epoch: int


def _unpack(item: Any) -> tuple[list[MicroBatch], dict[str, int], int]:
    if isinstance(item, _Failed):
        raise item.error
    micro_batches, skipped, n = item
    if isinstance(micro_batches, _PackedStep):  # from a worker
        micro_batches = micro_batches.unpack()
    return micro_batches, skipped, n


def _worker_init(worker_id: int) -> None:
    """Workers leave group signals to the main process: ``timeout`` and a terminal's Ctrl-C
    signal the whole process group, and a worker killed by them would fail the step the
    trainer is finishing before it saves. So a worker moves to a process group of its own
    (and ignores SIGINT). A SIGTERM sent to the worker itself still ends it: the loader's
    shutdown and multiprocessing's exit handler rely on that. A worker whose parent dies
    exits by itself (the DataLoader's watchdog)."""
    try:
        os.setpgid(0, 0)
    except OSError:  # not permitted here (e.g. a session leader): keep the parent's group
        pass
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def _default_context(num_workers: int) -> Any:
    if num_workers > 0 and "fork" in multiprocessing.get_all_start_methods():
        return "fork"
    return None


class StepLoader:
    """Yields a :class:`StepBatch` per step, forever, across epochs.

    Built on ``torch.utils.data.DataLoader(batch_sampler=..., collate_fn=...)``. The position
    (``state_dict``) counts batches *yielded*, not prefetched; ``load_state_dict`` makes the next
    batch the one at that position without replaying the epoch (and may be called while an
    iterator is live: it restarts there). Use one live iterator at a time.
    """

    def __init__(
        self,
        dataset: torch.utils.data.Dataset,
        collate: Collate,
        sampler: StepSampler,
        *,
        num_workers: int = 0,
        prefetch_factor: int | None = 2,
        persistent_workers: bool = False,
        multiprocessing_context: Any = None,
        timeout: float = 0,
        pin_memory: bool = False,
        balance_ranks: bool = False,
        buffer_steps: int = 1,
    ) -> None:
        if buffer_steps < 1:
            raise ValueError(f"buffer_steps must be >= 1, got {buffer_steps}")
        if buffer_steps > 1 and not sampler.drop_last:
            raise ValueError("a look-ahead buffer needs whole steps (a drop_last sampler)")
        self.dataset = dataset
        self.collate = collate
        self.sampler = sampler
        self.num_workers = num_workers
        self.prefetch_factor = prefetch_factor
        self.persistent_workers = persistent_workers and num_workers > 0
        self.multiprocessing_context = multiprocessing_context or _default_context(num_workers)
        self.timeout = timeout
        #: Steps arrive in page-locked memory (a CUDA run: ``non_blocking`` copies overlap).
        self.pin_memory = pin_memory
        #: Training steps are shared among the ranks by tokens (:class:`RankShare`), not as
        #: contiguous slices; evaluation (:meth:`iter_epoch_once`) keeps the slices.
        self.balance_ranks = balance_ranks
        #: The worker id of each data worker's pid, of the latest training iterator (a failure
        #: report names a dead worker by it after the iterator is shut down).
        self.worker_ids: dict[int, int] = {}
        #: Training steps are regrouped within this many steps (``[data] buffer_size``).
        self.buffer_steps = buffer_steps
        self._epoch = 0
        self._step = 0
        self._generation = 0
        self._batch_sampler = _BatchSampler(sampler, balance_ranks, buffer_steps)
        self._loader: torch.utils.data.DataLoader | None = None
        self._enough_data = False

    # -- position -------------------------------------------------------------------------

    @property
    def steps_per_epoch(self) -> int:
        """Optimizer steps in one epoch."""
        return self.sampler.steps_per_epoch

    def __len__(self) -> int:
        return self.steps_per_epoch

    @property
    def epoch(self) -> int:
        """The epoch of the next batch."""
        return self.state_dict()["epoch"]

    @property
    def step_in_epoch(self) -> int:
        """The step (within its epoch) of the next batch."""
        return self.state_dict()["step_in_epoch"]

    def state_dict(self) -> dict[str, int]:
        """``{"epoch": e, "step_in_epoch": k}``: the next batch yielded is step ``k`` of ``e``."""
        if self._step >= self.steps_per_epoch:
            return {"epoch": self._epoch + 1, "step_in_epoch": 0}
        return {"epoch": self._epoch, "step_in_epoch": self._step}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue at ``state`` (from :meth:`state_dict`)."""
        epoch, step = state.get("epoch"), state.get("step_in_epoch")
        if not isinstance(epoch, int) or not isinstance(step, int) or epoch < 0 or step < 0:
            raise ValueError(f"bad data loader state {dict(state)!r}")
        if step > self.steps_per_epoch:
            raise ValueError(
                f"data loader state is at step {step} of epoch {epoch} but an epoch has only "
                f"{self.steps_per_epoch} steps (did the data set or the batch size change?)"
            )
        self._epoch, self._step = epoch, step
        self._generation += 1

    # -- iteration ------------------------------------------------------------------------

    def _make_loader(
        self,
        batch_sampler: Any,
        persistent: bool,
        share: RankShare | None = None,
        planner: StepPlanner | None = None,
    ) -> torch.utils.data.DataLoader:
        kwargs: dict[str, Any] = {}
        if self.num_workers > 0:
            os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
            kwargs.update(
                prefetch_factor=self.prefetch_factor,
                persistent_workers=persistent,
                multiprocessing_context=self.multiprocessing_context,
                timeout=self.timeout,
                worker_init_fn=_worker_init,
            )
        return torch.utils.data.DataLoader(
            _CarryDataErrors(self.dataset),
            batch_sampler=batch_sampler,
            collate_fn=_StepCollate(self.collate, share, planner),
            num_workers=self.num_workers,
            pin_memory=self.pin_memory,
            # A private generator: creating an iterator must not consume the global torch RNG.
            generator=torch.Generator().manual_seed(self.sampler.seed),
            **kwargs,
        )

    def check_enough_data(self) -> None:
        """Raise :class:`DataError` if the dataset has fewer usable samples than one global
        batch (see the module docstring); prepares samples in order until it has seen that
        many. Passes at most once per loader, then costs nothing."""
        if self._enough_data:
            return
        need, total = self.sampler.global_batch_size, self.sampler.num_samples
        usable = 0
        skipped = SkipCounter()
        for index in range(total):
            item = self.dataset[index]
            if isinstance(item, Skipped):
                skipped.add(item.reason)
                continue
            usable += 1
            if usable >= need:
                self._enough_data = True
                return
        raise DataError(
            f"the training data has {usable} usable sample{'s' if usable != 1 else ''} of "
            f"{total}, fewer than one global batch ({need}): "
            f"{skipped.summary_line()}"
        )

    def __iter__(self) -> Iterator[StepBatch]:
        if self.steps_per_epoch == 0:
            return
        if self._loader is None:
            share = None
            if self.balance_ranks or self.buffer_steps > 1:
                share = RankShare(self.sampler.rank, self.sampler.world_size, self.balance_ranks)
            planner = self.step_planner() if self.buffer_steps > 1 else None
            self._loader = self._make_loader(
                self._batch_sampler, self.persistent_workers, share, planner
            )
        seen_usable = False
        while True:
            generation = self._generation
            epoch, start = self._epoch, self._step
            if start >= self.steps_per_epoch:
                self._epoch, self._step = epoch + 1, 0
                continue
            self._batch_sampler.epoch, self._batch_sampler.start_step = epoch, start
            interrupted = False
            epoch_usable = 0
            last_step = self.steps_per_epoch - 1
            for step, item in self._steps(epoch, start):
                if self._generation != generation:
                    interrupted = True
                    break
                micro_batches, skipped, n = _unpack(item)
                epoch_usable += n
                if n == 0 and not seen_usable:
                    self.check_enough_data()
                elif start == 0 and step == last_step:
                    if epoch_usable < self.sampler.local_batch_size:
                        self.check_enough_data()
                seen_usable = seen_usable or n > 0
                self._epoch, self._step = epoch, step + 1
                yield StepBatch(
                    micro_batches=micro_batches,
                    skipped=skipped,
                    num_samples=n,
                    epoch=epoch,
                    step_in_epoch=step,
                )
                if self._generation != generation:
                    interrupted = True
                    break
            if not interrupted:
                self._epoch, self._step = epoch + 1, 0

    def step_planner(self) -> StepPlanner:
        """How a buffer is regrouped into steps: with a token-budget collate and steps shared
        by tokens, planned for that budget; by length otherwise."""
        g = self.sampler.global_batch_size
        if self.balance_ranks and isinstance(self.collate, TokenBudgetCollate):
            return StepPlanner(
                g,
                self.sampler.world_size,
                self.collate.max_tokens,
                self.collate.runtime.options.micro_batch_size,
            )
        return StepPlanner(g)

    def _steps(self, epoch: int, start: int) -> Iterator[tuple[int, Any]]:
        """``(step, collated step)`` from ``start``; with a buffer, each buffer's steps in
        :meth:`StepSampler.step_order`, those before ``start`` (a resume) prepared and dropped."""
        assert self._loader is not None
        batches = iter(self._loader)
        workers = getattr(batches, "_workers", [])
        self.worker_ids = {int(w.pid): i for i, w in enumerate(workers) if w.pid is not None}
        k = self.buffer_steps
        if k == 1:
            yield from enumerate(batches, start)
            return
        for buffer, item in enumerate(batches, start // k):
            if isinstance(item, _Failed):
                yield max(start, buffer * k), item
                return
            for offset, group in enumerate(self.sampler.step_order(epoch, buffer, len(item))):
                if buffer * k + offset >= start:
                    yield buffer * k + offset, item[group]

    def iter_epoch_once(self) -> Iterator[StepBatch]:
        """One pass in dataset order, the last partial step kept (for evaluation).

        Independent of the training position; steps may hold fewer samples, and a rank may
        get none in the last step.
        """
        sampler = StepSampler(
            self.sampler.num_samples,
            self.sampler.global_batch_size,
            self.sampler.rank,
            self.sampler.world_size,
            shuffle=False,
            seed=self.sampler.seed,
            drop_last=False,
        )
        batch_sampler = _BatchSampler(sampler)
        loader = self._make_loader(batch_sampler, persistent=False)
        for step, item in enumerate(loader):
            micro_batches, skipped, n = _unpack(item)
            yield StepBatch(
                micro_batches=micro_batches,
                skipped=skipped,
                num_samples=n,
                epoch=0,
                step_in_epoch=step,
            )
