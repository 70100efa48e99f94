"""The ``padded`` batching runtime: right-padded (B, L) tensors with an attention mask."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar

from .base import BatchingRuntime
from .types import IGNORE_INDEX, MicroBatch, SampleFeatures

if TYPE_CHECKING:
    import torch


def round_up(n: int, multiple: int) -> int:
    """``n`` rounded up to a multiple of ``multiple`` (>= 1)."""
    multiple = max(1, multiple)
    return -(-n // multiple) * multiple


def position_channels(features: Sequence[SampleFeatures]) -> int | None:
    """``C`` when samples carry (C, L) position ids, None for (L,); mixing them is an error."""
    dims = {f.position_ids.dim() for f in features if f.position_ids is not None}
    if len(dims) > 1:
        raise ValueError("samples mix (L,) and (C, L) position_ids")
    if dims != {2}:
        return None
    channels = {int(f.position_ids.shape[0]) for f in features if f.position_ids is not None}
    if len(channels) > 1:
        raise ValueError(f"samples have different position_ids channels {sorted(channels)}")
    return channels.pop()


def sample_positions(feature: SampleFeatures, channels: int | None) -> torch.Tensor:
    """A sample's position ids as (L,) or (C, L) (``arange(L)`` when it has none)."""
    import torch

    pos = feature.position_ids
    if pos is None:
        pos = torch.arange(feature.length, dtype=torch.long)
        if channels is not None:
            pos = pos.unsqueeze(0).expand(channels, -1)
    if pos.shape[-1] != feature.length:
        raise ValueError(f"position_ids length {pos.shape[-1]} != {feature.length} tokens")
    return pos.long()


def concat_media(features: Sequence[SampleFeatures]) -> dict[str, torch.Tensor]:
    """Each media key's tensors concatenated along dim 0, in sample order."""
    return concat_rows([f.media for f in features])


def concat_rows(parts: Sequence[Mapping[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """Each key's tensors concatenated along dim 0, in order (keys in first-seen order)."""
    import torch

    keys: list[str] = []
    for part in parts:
        keys.extend(k for k in part if k not in keys)
    return {k: torch.cat([p[k] for p in parts if k in p], dim=0) for k in keys}


def token_field_names(features: Sequence[SampleFeatures]) -> list[str]:
    """The union of the samples' token-field names, in first-seen order."""
    names: list[str] = []
    for f in features:
        names.extend(k for k in f.token_fields if k not in names)
    return names


def batch_counts(features: Sequence[SampleFeatures], num_padding: int) -> dict[str, Any]:
    """The :class:`MicroBatch` count fields."""
    lengths = [f.length for f in features]
    return {
        "num_samples": len(features),
        "num_tokens": sum(lengths),
        "num_padding": num_padding,
        "num_loss_tokens": sum(f.num_loss_tokens for f in features),
        "num_images": sum(f.num_images for f in features),
        "image_meta": concat_rows([f.image_meta for f in features]),
        "sample_lengths": lengths,
        "meta": [dict(f.meta) for f in features],
    }


class PaddedRuntime(BatchingRuntime):
    """Right-pads to the longest sample (then to ``pad_to_multiple_of``).

    ``input_ids`` padded with ``pad_token_id``, labels with ``IGNORE_INDEX``, position ids and
    token fields with 0; ``attention_mask`` is 1 on real tokens.
    """

    name: ClassVar[str] = "padded"

    def make_micro_batch(self, features: Sequence[SampleFeatures]) -> MicroBatch:
        """(B, L) tensors; position ids (B, L) or (C, B, L)."""
        import torch

        if not features:
            raise ValueError("empty micro-batch")
        batch = len(features)
        width = round_up(max(f.length for f in features), self.options.pad_to_multiple_of)
        input_ids = torch.full((batch, width), self.options.pad_token_id, dtype=torch.long)
        labels = torch.full((batch, width), IGNORE_INDEX, dtype=torch.long)
        attention_mask = torch.zeros((batch, width), dtype=torch.long)
        channels = position_channels(features)
        pos_shape = (batch, width) if channels is None else (channels, batch, width)
        position_ids = torch.zeros(pos_shape, dtype=torch.long)
        fields = {
            name: torch.zeros((batch, width), dtype=self._field_dtype(features, name))
            for name in token_field_names(features)
        }
        for b, f in enumerate(features):
            n = f.length
            input_ids[b, :n] = f.input_ids
            labels[b, :n] = f.labels
            attention_mask[b, :n] = 1
            position_ids[..., b, :n] = sample_positions(f, channels)
            for name, value in f.token_fields.items():
                fields[name][b, :n] = value
        model_inputs: dict[str, Any] = {
            "input_ids": input_ids,
            "attention_mask": attention_mask,
            "position_ids": position_ids,
            **fields,
            **concat_media(features),
        }
        num_padding = batch * width - sum(f.length for f in features)
        return MicroBatch(
            model_inputs=model_inputs,
            loss_inputs={"labels": labels},
            **batch_counts(features, num_padding),
        )

    @staticmethod
    def _field_dtype(features: Sequence[SampleFeatures], name: str) -> torch.dtype:
        return next(f.token_fields[name].dtype for f in features if name in f.token_fields)
