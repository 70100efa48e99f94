"""``flex_varlen`` attention: torch's ``flex_attention`` over a whole packed row, with a
``BlockMask`` built from the row's sample boundaries (``cu_seq_lens_q``), its bidirectional
spans (:data:`~hyper_core.attention.BIDIRECTIONAL_SPANS`) and the layer's sliding window.

The mask: a query attends to a key of its own sample that is not later than it, or that lies
in the same span; with a sliding window, only to keys less than ``window`` before it (as
transformers composes its ``token_type_ids`` block mask). One ``BlockMask`` per row and
window is built once per forward and shared by the layers. On CUDA ``flex_attention`` runs
compiled. Where flex cannot run, the call goes to ``varlen`` (the same math, per-sample SDPA):
no ``cu_seq_lens_q`` (an unpacked forward), a padding mask or a cache, a non-causal module,
dropout, and a backward on CPU (torch's flex attention has none there).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch
from torch.utils.weak import WeakIdKeyDictionary

from . import BIDIRECTIONAL_SPANS, FLEX_VARLEN
from .varlen import (
    check_spans,
    context_parallel_aware,
    cu_bounds,
    span_list,
    varlen_attention,
    varlen_mask,
)

# Per cu_seq_lens tensor (every layer of a forward gets the same one): its BlockMasks, by
# (spans, window).
_MASKS: WeakIdKeyDictionary = WeakIdKeyDictionary()


def row_mask_mod(
    bounds: list[int], spans: list[tuple[int, int]], sliding_window: int | None, device: Any
) -> Callable[..., torch.Tensor]:
    """The ``mask_mod`` of a packed row: samples ``[bounds[i], bounds[i+1])``, causal within
    each, ``spans`` (row positions ``[start, end)``) both ways, the window on top."""
    total = bounds[-1]
    sample = torch.zeros(total, dtype=torch.int32, device=device)
    for i, start in enumerate(bounds[1:-1], start=1):
        sample[start:] = i
    span = torch.full((total,), -1, dtype=torch.int32, device=device)
    for k, (a, b) in enumerate(spans):
        span[a:b] = k

    def mask_mod(b: Any, h: Any, q: torch.Tensor, kv: torch.Tensor) -> torch.Tensor:
        same_span = (span[q] == span[kv]) & (span[q] >= 0)
        allowed = (sample[q] == sample[kv]) & ((kv <= q) | same_span)
        if sliding_window is not None:
            allowed = allowed & (q - kv < sliding_window)
        return allowed

    return mask_mod


def row_block_mask(
    cu_seq_lens: torch.Tensor,
    spans: list[tuple[int, int]],
    sliding_window: int | None,
    device: torch.device,
) -> Any:
    """The ``BlockMask`` of :func:`row_mask_mod` (cached per ``cu_seq_lens`` tensor)."""
    from torch.nn.attention.flex_attention import create_block_mask

    key = (tuple(spans), sliding_window, str(device))
    per_row = _MASKS.get(cu_seq_lens)
    if per_row is None or per_row[0] != cu_seq_lens._version:
        per_row = (cu_seq_lens._version, {})
        _MASKS[cu_seq_lens] = per_row
    if key not in per_row[1]:
        bounds = cu_bounds(cu_seq_lens)
        mod = row_mask_mod(bounds, spans, sliding_window, device)
        total = bounds[-1]
        per_row[1][key] = create_block_mask(mod, None, None, total, total, device=device)
    return per_row[1][key]


@functools.cache
def _compiled_flex() -> Callable[..., torch.Tensor]:
    from torch.nn.attention.flex_attention import flex_attention

    return torch.compile(flex_attention, dynamic=False)


def _flex(device: torch.device) -> Callable[..., torch.Tensor]:
    from torch.nn.attention.flex_attention import flex_attention

    return _compiled_flex() if device.type == "cuda" else flex_attention


def flex_varlen_attention(
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
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """transformers' attention-function signature; ``(B, L, H, Dv)`` output, no weights."""
    batch, heads, q_len, _ = query.shape
    causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    spans = kwargs.get(BIDIRECTIONAL_SPANS)
    if spans is not None:  # the packed row's mask is the declared one (see varlen)
        attention_mask = None
    cpu_backward = query.device.type == "cpu" and torch.is_grad_enabled() and query.requires_grad
    cu_k = kwargs.get("cu_seq_lens_k")
    if (
        cu_seq_lens_q is None
        or (cu_k is not None and cu_k is not cu_seq_lens_q)
        or attention_mask is not None
        or q_len != key.shape[2]
        or not causal
        or dropout
        or cpu_backward
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
            **kwargs,
        )
    found = span_list(spans) if spans is not None else []
    check_spans(found, cu_bounds(cu_seq_lens_q))
    block_mask = row_block_mask(cu_seq_lens_q, found, sliding_window, query.device)
    softcap = kwargs.get("softcap")
    score_mod = None
    if softcap is not None:

        def score_mod(score: torch.Tensor, *_: Any) -> torch.Tensor:
            return softcap * torch.tanh(score / softcap)

    def row(x: torch.Tensor) -> torch.Tensor:  # (B, H, L, D) -> (1, H, B·L, D)
        b, h, n, d = x.shape
        return x if b == 1 else x.transpose(0, 1).reshape(1, h, b * n, d)

    out = _flex(query.device)(
        row(query),
        row(key),
        row(value),
        score_mod=score_mod,
        block_mask=block_mask,
        scale=scaling,
        enable_gqa=heads != key.shape[1],
    )
    # (1, H, B·L, Dv) -> (B, L, H, Dv)
    return out.transpose(1, 2).reshape(batch, q_len, heads, value.shape[-1]), None


#: ``flex_varlen`` as registered with transformers, context-parallel aware.
flex_varlen_forward = context_parallel_aware(flex_varlen_attention)


def register() -> None:
    """Register :data:`~hyper_core.attention.FLEX_VARLEN` with transformers (idempotent)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    if FLEX_VARLEN not in AttentionInterface._global_mapping:
        AttentionInterface.register(FLEX_VARLEN, flex_varlen_forward)
    if FLEX_VARLEN not in AttentionMaskInterface._global_mapping:
        AttentionMaskInterface.register(FLEX_VARLEN, varlen_mask)
