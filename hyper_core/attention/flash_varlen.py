"""``flash_varlen``: torch's own variable-length flash kernel on CUDA, one call per layer.

transformers gives the sample boundaries of a packed row (``cu_seq_lens_*``) only to attention
implementations whose name contains "flash": the Qwen-VL vision towers compute theirs and pass
them, one call per block; otherwise they loop over windows and images, one SDPA call each (and a
``lengths.tolist()`` per block). flash-attn has no wheel in the package registry; torch 2.13
has ``torch.nn.attention.varlen.varlen_attn``. This implementation, registered under a name with
"flash" in it, calls that kernel with the boundaries on CUDA: one call per attention layer of
the decoder and of the vision tower. Elsewhere (CPU) it is ``varlen``'s per-sample SDPA
(:mod:`.varlen`), the same math.

Causal attention is the kernel's window ``(-1, 0)`` (``(w - 1, 0)`` with a sliding window of
``w``), bidirectional ``(-1, -1)``. A padded batch (an attention mask) goes to SDPA, like
``varlen``; fp32 attention (no autocast) is ``varlen``'s, as the kernel has no fp32.

Older torch releases have the kernel with a smaller signature: 2.11 has ``scale`` and
``window_size`` but no ``enable_gqa`` (grouped KV heads are repeated), earlier ones only
``is_causal`` (the softmax scale is folded into the query, a sliding window falls back to
``varlen``). Boundaries go to the device once per forward (every layer gets the same
``cu_seq_lens`` tensor), not once per layer.
"""

from __future__ import annotations

import functools
import inspect
import math
from collections.abc import Callable
from itertools import pairwise
from typing import Any

import torch
from torch.utils.weak import WeakIdKeyDictionary

from .varlen import (
    context_parallel_aware,
    cu_bounds,
    packed_bounds,
    varlen_attention,
    varlen_mask,
)

#: The name ``[model] attn_implementation`` gives to :func:`flash_varlen_forward`.
FLASH_VARLEN = "flash_varlen"


def kernel() -> Callable[..., torch.Tensor]:
    """torch's varlen flash-attention kernel (looked up per call: tests stub it)."""
    from torch.nn.attention.varlen import varlen_attn

    return varlen_attn


def uses_kernel(query: torch.Tensor) -> bool:
    """Whether the kernel runs here: half-precision CUDA tensors (the kernel has no fp32)."""
    return query.is_cuda and query.dtype in (torch.float16, torch.bfloat16)


#: Per boundary tensor (cu_seq_lens or position_ids, by identity and version): the int32
#: boundaries on the device and the longest segment, so a forward's layers share one copy.
_KERNEL_BOUNDS: WeakIdKeyDictionary = WeakIdKeyDictionary()


def _boundaries(
    batch: int,
    length: int,
    device: torch.device,
    cu_seq_lens: torch.Tensor | None,
    position_ids: torch.Tensor | None,
) -> tuple[torch.Tensor, int]:
    """``(cu_seqlens int32 on device, longest segment)`` over the flattened ``batch·length``."""
    source = cu_seq_lens if cu_seq_lens is not None else position_ids
    if source is not None:
        hit = _KERNEL_BOUNDS.get(source)
        if hit is not None and hit[0] == source._version and hit[1].device == device:
            return hit[1], hit[2]
    if cu_seq_lens is not None:
        bounds = cu_bounds(cu_seq_lens)
        cu = cu_seq_lens.to(device=device, dtype=torch.int32)  # on the device already: no copy
    else:
        found = packed_bounds(position_ids, batch, length) if position_ids is not None else None
        bounds = found or [b * length for b in range(batch + 1)]
        cu = torch.tensor(bounds, dtype=torch.int32).to(device, non_blocking=True)
    longest = max(b - a for a, b in pairwise(bounds))
    if source is not None:
        _KERNEL_BOUNDS[source] = (source._version, cu, longest)
    return cu, longest


@functools.cache
def _parameters(fn: Callable[..., torch.Tensor]) -> frozenset[str]:
    return frozenset(inspect.signature(fn).parameters)


def _supports(fn: Callable[..., torch.Tensor], name: str) -> bool:
    try:
        return name in _parameters(fn)
    except (TypeError, ValueError):  # no signature to read: assume the current one
        return True


def _call_kernel(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_q: torch.Tensor,
    cu_k: torch.Tensor,
    longest_q: int,
    longest_k: int,
    *,
    scale: float | None,
    causal: bool,
    sliding_window: int | None,
) -> torch.Tensor:
    """Call the kernel on ``(tokens, heads, dim)`` tensors through the signature it has."""
    fn = kernel()
    kwargs: dict[str, Any] = {}
    if _supports(fn, "window_size"):
        left = sliding_window - 1 if sliding_window is not None else -1
        kwargs["window_size"] = (left, 0) if causal else (-1, -1)
    else:  # torch 2.9-2.10; a sliding window went to `varlen` before this call
        kwargs["is_causal"] = causal
    if scale is not None:
        if _supports(fn, "scale"):
            kwargs["scale"] = scale
        else:
            q = q * (scale * math.sqrt(q.shape[-1]))  # the kernel's own scale is 1/sqrt(dim)
    heads, kv_heads = q.shape[1], k.shape[1]
    if heads != kv_heads:
        if _supports(fn, "enable_gqa"):
            kwargs["enable_gqa"] = True
        else:  # torch 2.11 and older: no grouped-query attention in the kernel
            k = k.repeat_interleave(heads // kv_heads, dim=1)
            v = v.repeat_interleave(heads // kv_heads, dim=1)
    return fn(q, k, v, cu_q, cu_k, longest_q, longest_k, **kwargs)


def flash_varlen_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    is_causal: bool | None = None,
    sliding_window: int | None = None,
    cu_seq_lens_q: torch.Tensor | None = None,
    cu_seq_lens_k: torch.Tensor | None = None,
    max_length_q: int | None = None,
    max_length_k: int | None = None,
    position_ids: torch.Tensor | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """transformers' attention-function signature; ``(B, L, H, Dv)`` output, no weights."""
    batch, heads, length, _ = query.shape
    causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    window_unsupported = (
        sliding_window is not None and causal and not _supports(kernel(), "window_size")
    )
    if (
        not uses_kernel(query)
        or attention_mask is not None
        or length != key.shape[2]
        or window_unsupported
    ):
        return varlen_attention(
            module,
            query,
            key,
            value,
            attention_mask,
            dropout=dropout,
            scaling=scaling,
            is_causal=is_causal,
            sliding_window=sliding_window,
            cu_seq_lens_q=cu_seq_lens_q,
            cu_seq_lens_k=cu_seq_lens_k,
            max_length_q=max_length_q,
            max_length_k=max_length_k,
            position_ids=position_ids,
            **kwargs,
        )
    if dropout:
        raise ValueError("`flash_varlen` attention has no dropout; use `varlen` or `sdpa`")
    cu_q, longest = _boundaries(batch, length, query.device, cu_seq_lens_q, position_ids)
    cu_k, longest_k = cu_q, longest
    if cu_seq_lens_k is not None and cu_seq_lens_k is not cu_seq_lens_q:
        cu_k, longest_k = _boundaries(batch, length, query.device, cu_seq_lens_k, None)

    def tokens(x: torch.Tensor) -> torch.Tensor:  # (B, H, L, D) -> (B·L, H, D)
        return x.transpose(1, 2).reshape(batch * length, x.shape[1], x.shape[-1])

    out = _call_kernel(
        tokens(query),
        tokens(key),
        tokens(value),
        cu_q,
        cu_k,
        longest,
        longest_k,
        scale=scaling,
        causal=causal,
        sliding_window=sliding_window,
    )
    return out.reshape(batch, length, heads, value.shape[-1]), None


#: ``flash_varlen`` as registered with transformers, context-parallel aware.
flash_varlen_forward = context_parallel_aware(flash_varlen_attention)


def register() -> None:
    """Register :data:`FLASH_VARLEN` with transformers (idempotent)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    if FLASH_VARLEN not in AttentionInterface._global_mapping:
        AttentionInterface.register(FLASH_VARLEN, flash_varlen_forward)
    if FLASH_VARLEN not in AttentionMaskInterface._global_mapping:
        AttentionMaskInterface.register(FLASH_VARLEN, varlen_mask)
