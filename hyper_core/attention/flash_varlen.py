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
``varlen``.
"""

from __future__ import annotations

from collections.abc import Callable
from itertools import pairwise
from typing import Any

import torch

from .varlen import cu_bounds, packed_bounds, varlen_attention_forward, varlen_mask

#: The name ``[model] attn_implementation`` gives to :func:`flash_varlen_forward`.
FLASH_VARLEN = "flash_varlen"


def kernel() -> Callable[..., torch.Tensor]:
    """torch's varlen flash-attention kernel (looked up per call: tests stub it)."""
    from torch.nn.attention.varlen import varlen_attn

    return varlen_attn


def uses_kernel(query: torch.Tensor) -> bool:
    """Whether the kernel runs here: CUDA tensors."""
    return query.is_cuda


def _boundaries(
    batch: int,
    length: int,
    device: torch.device,
    cu_seq_lens: torch.Tensor | None,
    position_ids: torch.Tensor | None,
) -> tuple[torch.Tensor, int]:
    """``(cu_seqlens int32 on device, longest segment)`` over the flattened ``batch·length``."""
    if cu_seq_lens is not None:
        bounds = cu_bounds(cu_seq_lens)
    elif position_ids is not None and (found := packed_bounds(position_ids, batch, length)):
        bounds = found
    else:
        bounds = [b * length for b in range(batch + 1)]
    longest = max(b - a for a, b in pairwise(bounds))
    return torch.tensor(bounds, dtype=torch.int32, device=device), longest


def flash_varlen_forward(
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
    if not uses_kernel(query) or attention_mask is not None or length != key.shape[2]:
        return varlen_attention_forward(
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
    causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    cu_q, longest = _boundaries(batch, length, query.device, cu_seq_lens_q, position_ids)
    cu_k = cu_q if cu_seq_lens_k is None or cu_seq_lens_k is cu_seq_lens_q else None
    if cu_k is None:
        cu_k, _ = _boundaries(batch, length, query.device, cu_seq_lens_k, None)
    left = sliding_window - 1 if sliding_window is not None else -1
    window = (left, 0) if causal else (-1, -1)

    def tokens(x: torch.Tensor) -> torch.Tensor:  # (B, H, L, D) -> (B·L, H, D)
        return x.transpose(1, 2).reshape(batch * length, x.shape[1], x.shape[-1])

    out = kernel()(
        tokens(query),
        tokens(key),
        tokens(value),
        cu_q,
        cu_k,
        longest,
        longest,
        scale=scaling,
        window_size=window,
        enable_gqa=heads != key.shape[1],
    )
    return out.reshape(batch, length, heads, value.shape[-1]), None


def register() -> None:
    """Register :data:`FLASH_VARLEN` with transformers (idempotent)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    if FLASH_VARLEN not in AttentionInterface._global_mapping:
        AttentionInterface.register(FLASH_VARLEN, flash_varlen_forward)
    if FLASH_VARLEN not in AttentionMaskInterface._global_mapping:
        AttentionMaskInterface.register(FLASH_VARLEN, varlen_mask)
