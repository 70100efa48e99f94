"""The ``[encoder_parallel]`` config section (no torch here)."""

from __future__ import annotations

from typing import Literal

import attrs

from hyper_core.config.fields import at_least, meta, not_empty


@attrs.frozen(kw_only=True)
class EncoderParallelConfig:
    """``[encoder_parallel]``: balance the vision encoder's work across data-parallel ranks.

    Two ways to switch it on: ``enabled = true`` with any ``[parallel] strategy`` (``ddp``,
    ``fsdp2``, ...), or ``[parallel] strategy = "encoder_parallel"``, which means ``base``
    underneath with balancing on.
    """

    enabled: bool = attrs.field(
        default=False,
        metadata=meta(
            "Balance vision-encoder work across ranks on top of `[parallel] strategy` "
            '(implied by `strategy = "encoder_parallel"`).'
        ),
    )
    base: str = attrs.field(
        default="fsdp2",
        validator=not_empty,
        metadata=meta(
            'The strategy underneath `[parallel] strategy = "encoder_parallel"` '
            "(`ddp`, `fsdp2`, ...); ignored with `enabled = true`."
        ),
    )
    cost_model: Literal["patches", "patches+attention"] = attrs.field(
        default="patches",
        metadata=meta(
            "Per-image encoder cost: `patches` (linear), or `patches+attention` "
            "(p + p² / attention_patches)."
        ),
    )
    attention_patches: int = attrs.field(
        default=7680,
        validator=at_least(1),
        metadata=meta(
            "For `patches+attention`: the image size (patches) at which attention costs as "
            "much as the dense part of a layer (about 6 × the encoder's hidden size)."
        ),
    )
    min_images: int = attrs.field(
        default=2,
        validator=at_least(1),
        metadata=meta(
            "Rebalance a micro-step only when all ranks together hold at least this many images."
        ),
    )
    min_imbalance: float = attrs.field(
        default=1.0,
        validator=at_least(1.0),
        metadata=meta(
            "Rebalance only when the most loaded rank's cost exceeds the mean by more than "
            "this factor (1.0: whenever it helps)."
        ),
    )
    profile: bool = attrs.field(
        default=False,
        metadata=meta(
            "Time the vision encoder on every rank (synchronising the device) and log "
            "`encoder_parallel/encoder_ms_max`/`_mean`."
        ),
    )
