"""Choosing the batching runtime of a run by registered name."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..resolve import named

if TYPE_CHECKING:
    from ..registry import Registries


def resolve_runtime(
    config: Any, adapter: Any, assets: Any, registries: Registries, *, vision_filler: bool = False
) -> Any:
    """The batching runtime of ``[data] batching`` (default: the adapter's); with
    ``vision_filler``, it adds the adapter's vision filler to image-less micro-batches."""
    from ..attention import uses_varlen_kwargs
    from .base import BatchingOptions

    name = config.data.batching or adapter.default_batching
    cls = named("$.data.batching", registries.batching_runtimes, name)
    return cls(
        BatchingOptions(
            micro_batch_size=config.training.micro_batch_size,
            max_seq_len=config.data.max_seq_len,
            pad_token_id=assets.pad_token_id,
            varlen_kwargs=uses_varlen_kwargs(config.model.attn_implementation),
            vision_filler=adapter.vision_filler(assets) if vision_filler else None,
        )
    )
