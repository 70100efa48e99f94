"""The ``packed`` (padding-free) batching runtime: one row, per-sample position ids."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, ClassVar

from ..attention import BIDIRECTIONAL_SPANS
from .base import BatchingRuntime
from .padded import (
    batch_counts,
    concat_media,
    position_channels,
    round_up,
    sample_positions,
    token_field_names,
)
from .types import IGNORE_INDEX, MicroBatch, SampleFeatures

if TYPE_CHECKING:
    import torch


def boundary_kwargs(lengths: Sequence[int]) -> dict[str, Any]:
    """Flash-attention's varlen forward kwargs for segments of ``lengths`` tokens, in order."""
    import torch

    cu = torch.zeros(len(lengths) + 1, dtype=torch.int32)
    cu[1:] = torch.tensor(lengths, dtype=torch.int32).cumsum(0)
    longest = max(lengths)
    # One tensor for q and k: the attention function converts it to host ints once per forward.
    return {
        "cu_seq_lens_q": cu,
        "cu_seq_lens_k": cu,
        "max_length_q": longest,
        "max_length_k": longest,
    }


def row_spans(features: Sequence[SampleFeatures]) -> torch.Tensor | None:
    """The samples' :attr:`~SampleFeatures.bidirectional_spans` over the packed row, an int
    ``(n, 2)`` tensor (None when there are none)."""
    import torch

    spans, offset = [], 0
    for f in features:
        spans += [(offset + a, offset + b) for a, b in f.bidirectional_spans]
        offset += f.length
    return torch.tensor(spans, dtype=torch.int64) if spans else None


class PackedRuntime(BatchingRuntime):
    """Concatenates the micro-batch's samples into a single (1, ΣL) row, no attention mask.

    Each sample's position ids restart at its own positions; ``transformers`` derives the
    sample boundaries from them when ``attention_mask`` is None and ``use_cache=False``, so
    samples never attend to each other. With ``pad_to_multiple_of > 1`` a padding segment is
    appended, its positions restarting at 0 (a separate "sample" with no loss). With
    ``varlen_kwargs`` the boundaries (padding segment included) are also given explicitly as
    flash-attention's ``cu_seq_lens_*``/``max_length_*``, and the samples' bidirectional spans
    as :data:`~hyper_core.attention.BIDIRECTIONAL_SPANS`.
    """

    name: ClassVar[str] = "packed"

    def make_micro_batch(self, features: Sequence[SampleFeatures]) -> MicroBatch:
        """(1, ΣL) tensors; position ids (1, ΣL) or (C, 1, ΣL)."""
        import torch

        if not features:
            raise ValueError("empty micro-batch")
        total = sum(f.length for f in features)
        num_padding = round_up(total, self.options.pad_to_multiple_of) - total
        channels = position_channels(features)
        ids = [f.input_ids.long() for f in features]
        labels = [f.labels.long() for f in features]
        positions = [sample_positions(f, channels) for f in features]
        names = token_field_names(features)
        fields: dict[str, list[torch.Tensor]] = {name: [] for name in names}
        for f in features:
            for name in names:
                value = f.token_fields.get(name)
                if value is None:
                    dtype = next(
                        g.token_fields[name].dtype for g in features if name in g.token_fields
                    )
                    value = torch.zeros(f.length, dtype=dtype)
                fields[name].append(value)
        if num_padding:
            ids.append(torch.full((num_padding,), self.options.pad_token_id, dtype=torch.long))
            labels.append(torch.full((num_padding,), IGNORE_INDEX, dtype=torch.long))
            pad_pos = torch.arange(num_padding, dtype=torch.long)
            positions.append(pad_pos if channels is None else pad_pos.expand(channels, -1))
            for name in names:
                fields[name].append(torch.zeros(num_padding, dtype=fields[name][0].dtype))
        model_inputs: dict[str, Any] = {
            "input_ids": torch.cat(ids).unsqueeze(0),
            "position_ids": torch.cat(positions, dim=-1).unsqueeze(-2),
            **{name: torch.cat(values).unsqueeze(0) for name, values in fields.items()},
            **concat_media(features),
        }
        if self.options.varlen_kwargs:
            lengths = [f.length for f in features] + ([num_padding] if num_padding else [])
            model_inputs.update(boundary_kwargs(lengths))
            spans = row_spans(features)
            if spans is not None:
                model_inputs[BIDIRECTIONAL_SPANS] = spans
        return MicroBatch(
            model_inputs=model_inputs,
            loss_inputs={"labels": torch.cat(labels).unsqueeze(0)},
            **batch_counts(features, num_padding),
        )
