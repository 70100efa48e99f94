"""Pairs into micro-batches: both sides of a pair go in the same micro-batch.

:class:`PairBatching` adapts the run's batching runtime (``packed`` with varlen attention, or
``padded``): a micro-batch holds ``micro_batch_size`` *pairs* (or, with ``[data]
max_tokens_per_micro_batch``, as many as fit, both sides counted), laid out by the runtime as
``chosen₀, rejected₀, chosen₁, rejected₁, ...``. Each token's sequence number (``2·pair +
side + 1``, 0 for padding and the vision filler) rides through the runtime as a token field,
so it has the layout of the labels whatever the runtime, and moves to ``loss_inputs``
(``preference_sequence``) where the loss sums per-token log-probs per sequence.

A micro-batch's ``num_loss_tokens`` is its number of pairs: the trainer's global count of loss
units is then the step's pairs, and the loss, a sum over pairs divided by it, is the mean over
the global batch (gradient accumulation and data parallelism exact, as for the SFT loss).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import attrs

from hyper_core.batching.base import BatchingRuntime
from hyper_core.batching.types import MicroBatch, SampleFeatures

from .data import PairFeatures
from .vision import add_present, share_images

if TYPE_CHECKING:
    from hyper_core.adapters.base import VisionEncoderSpec

SEQUENCE_FIELD = "preference_sequence"
#: ``loss_inputs`` key: the number of pairs in the micro-batch (a host int).
PAIRS_KEY = "preference_pairs"


def _numbered(features: SampleFeatures, number: int) -> SampleFeatures:
    import torch

    field = torch.full((features.length,), number, dtype=torch.long)
    return attrs.evolve(features, token_fields={**features.token_fields, SEQUENCE_FIELD: field})


class PairBatching:
    """The run's ``runtime`` seen as a runtime of pairs (``collate``, ``split``,
    ``with_filler``, ``options``, ``name``: what the core's collates use)."""

    def __init__(self, runtime: BatchingRuntime, vision: VisionEncoderSpec | None = None) -> None:
        self.runtime = runtime
        self.options = runtime.options
        self.name = runtime.name
        #: The vision encoder whose inputs a pair's two sides share (None: each side its own).
        self.vision = vision

    def split(self, features: Sequence[SampleFeatures]) -> list[list[SampleFeatures]]:
        """``micro_batch_size`` pairs per micro-batch."""
        return self.runtime.split(features)

    def collate(self, features: Sequence[SampleFeatures]) -> list[MicroBatch]:
        """The micro-batches of one step's pairs."""
        return [self.with_filler(group) for group in self.split(features) if group]

    def __call__(self, features: Sequence[SampleFeatures]) -> list[MicroBatch]:
        return self.collate(features)

    def with_filler(self, pairs: Sequence[SampleFeatures]) -> MicroBatch:
        """One micro-batch of ``pairs`` (the runtime adds its vision filler as usual)."""
        sequences: list[SampleFeatures] = []
        for i, pair in enumerate(pairs):
            if not isinstance(pair, PairFeatures):
                kind = type(pair).__name__
                raise TypeError(f"a [preference] micro-batch takes pairs, got {kind}")
            sequences.append(_numbered(pair.chosen, 2 * i + 1))
            sequences.append(_numbered(pair.rejected, 2 * i + 2))
        shared = share_images(sequences, self.vision) if self.vision is not None else None
        if shared is not None:
            sequences = shared[0]
        mb = self.runtime.with_filler(sequences)
        if shared is not None:
            lists = shared[1]
            filler = self.runtime.vision_filler
            if mb.meta and (mb.meta[-1] or {}).get("filler") and filler is not None:
                add_present(lists, filler.num_images)
            mb.model_inputs.update(lists)
        sequence = mb.model_inputs.pop(SEQUENCE_FIELD)
        mb.loss_inputs[SEQUENCE_FIELD] = sequence
        mb.loss_inputs[PAIRS_KEY] = len(pairs)
        mb.num_samples = len(pairs)
        mb.num_loss_tokens = len(pairs)
        return mb

    def make_micro_batch(self, pairs: Sequence[SampleFeatures]) -> MicroBatch:
        """:meth:`with_filler` (the core's collates call either)."""
        return self.with_filler(pairs)

    def to_device(self, micro_batch: MicroBatch, device: Any) -> tuple[dict, dict]:
        """The runtime's ``to_device``."""
        return self.runtime.to_device(micro_batch, device)


def pair_collate(
    inner: Any, runtime: BatchingRuntime, vision: VisionEncoderSpec | None = None
) -> Any:
    """The collate of a preference run, in place of the core's ``inner`` one: pairs per
    micro-batch, or the token budget's packing of pairs (``vision``: encode each pair's
    images once, see :mod:`hyper_preference.vision`)."""
    from hyper_core.batching.token_budget import TokenBudgetCollate

    pairs = PairBatching(runtime, vision)
    if isinstance(inner, TokenBudgetCollate):
        return TokenBudgetCollate(pairs, inner.max_tokens)  # type: ignore[arg-type]
    return pairs
