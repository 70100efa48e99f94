"""Training precision: FSDP2's default mixed-precision dtypes and the pure-bf16 warning.

fp32 master weights with bf16 compute is the default way to train at bf16: ``[model] dtype =
"float32"`` with ``[training] mixed_precision = "bf16"`` keeps parameters, gradients and AdamW
state fp32; FSDP2 then gathers bf16 parameters and reduces gradients in fp32 unless
``[parallel] param_dtype``/``reduce_dtype`` say otherwise. Pure bf16 parameters (``[model]
dtype = "bfloat16"``) are an explicit opt-in; :func:`warn_pure_bf16` tells the run once when
most of AdamW's steps would be rounded away.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

import attrs

if TYPE_CHECKING:
    import torch

    from ..parallel.env import DistEnv

log = logging.getLogger("hyper_train")

#: Warn when more than this fraction of the trainable bf16 weights would not move by one step.
ROUNDED_AWAY_THRESHOLD = 0.5
#: A step ``lr`` is rounded away when ``|w| · 2^-9 > lr``: bf16 has 8 significant bits, so half
#: an ulp of ``|w|`` is at least ``|w| · 2^-9``.
_HALF_ULP_FACTOR = 2.0**-9


@attrs.frozen
class FSDPPrecision:
    """FSDP2's mixed-precision dtypes (names as in the config; None: the parameter's own)."""

    param_dtype: str | None
    reduce_dtype: str | None


def fsdp_precision(parallel: Any, training: Any) -> FSDPPrecision:
    """``[parallel] param_dtype``/``reduce_dtype``; when unset and ``[training]
    mixed_precision = "bf16"``, bf16 gathered parameters and fp32 gradient reduction."""
    bf16 = training.mixed_precision == "bf16"
    param = parallel.param_dtype or ("bfloat16" if bf16 else None)
    reduce = parallel.reduce_dtype or ("float32" if bf16 else None)
    return FSDPPrecision(param_dtype=param, reduce_dtype=reduce)


def _local(p: torch.Tensor) -> torch.Tensor:
    to_local = getattr(p, "to_local", None)  # a DTensor shard (fsdp2)
    return to_local() if to_local is not None else p


def rounded_away_fraction(model: torch.nn.Module, lr: float, dist: DistEnv) -> float | None:
    """The fraction of trainable bf16 weight entries with ``|w| · 2^-9 > lr`` (a step of size
    ``lr`` is below half a bf16 ulp), over all ranks' shards; None without such weights.

    A collective when distributed: every rank must call it. Replicas (DDP, HSDP) count in the
    numerator and the denominator alike, so the fraction is the model's.
    """
    import torch

    counts = torch.zeros(2, dtype=torch.float64, device=dist.device)
    with torch.no_grad():
        for p in model.parameters():
            if not p.requires_grad or p.dtype != torch.bfloat16:
                continue
            local = _local(p)
            if local.numel() == 0:
                continue
            # compared in bf16 (no fp32 copy of the weights): |w| > lr · 2^9
            counts[0] += (local.abs() > lr / _HALF_ULP_FACTOR).sum().to(counts.dtype)
            counts[1] += local.numel()
    dist.all_reduce_sum(counts)
    if counts[1].item() == 0:
        return None
    return float(counts[0].item() / counts[1].item())


def warn_pure_bf16(config: Any, model: torch.nn.Module, dist: DistEnv) -> float | None:
    """With ``[model] dtype = "bfloat16"`` while training, warn once (main rank) when more than
    :data:`ROUNDED_AWAY_THRESHOLD` of the weights would not change by a step of size ``lr``.
    Returns the measured fraction (None when the weights are not bf16)."""
    if config.model.dtype != "bfloat16":
        return None
    lr = float(config.training.lr)
    fraction = rounded_away_fraction(model, lr, dist)
    if fraction is not None and fraction > ROUNDED_AWAY_THRESHOLD and dist.is_main:
        log.warning(
            "pure bf16 weights: at lr %g, %.0f%% of weights would not change by one AdamW step "
            'of size lr; train with [model] dtype = "float32" and [training] mixed_precision = '
            '"bf16" (fp32 master weights)',
            lr,
            100 * fraction,
        )
    return fraction
