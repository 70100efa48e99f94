"""``flash_varlen``: one varlen attention kernel call per layer, on every device.

transformers gives the sample boundaries of a packed row (``cu_seq_lens_*``) only to attention
implementations whose name contains "flash": the Qwen-VL vision towers compute theirs and pass
them, one call per block; otherwise they loop over windows and images, one SDPA call each (and a
``lengths.tolist()`` per block). flash-attn has no wheel in the package registry; torch has
``torch.nn.attention.varlen.varlen_attn``, a registered custom op over its CUDA flash kernel.
This implementation, registered under a name with "flash" in it, calls the device's kernel once
per attention layer of the decoder and of the vision tower:

- CUDA, bf16/fp16: torch's varlen flash kernel;
- elsewhere (CPU): ``hyper_train::varlen_attn`` (:mod:`.varlen_op`), a custom op whose body is
  ``varlen``'s per-sample SDPA, the same math.

Both are custom ops that take the batch's boundaries as a device tensor and the longest sample
as an int, which the packed runtime puts in every micro-batch (``cu_seq_lens_q``,
``max_length_q``): no host work and no Python cache runs inside a compiled layer, so ``[training]
compile`` traces a decoder layer or vision block with no graph break.

Under autocast, q/k/v are cast to the autocast dtype first, as SDPA does: with fp32 master
weights the rotary embedding leaves q and k in fp32 (autocast does not cover element-wise
ops), and the CUDA kernel has no fp32. What still cannot run the kernel (a padding mask, a KV
cache, fp32 on CUDA without autocast, a sliding window the installed kernel cannot take) goes
to ``varlen`` and is counted with its reason (:mod:`.counts`), logged once per run.

Causal attention is the kernel's window ``(-1, 0)`` (``(w - 1, 0)`` with a sliding window of
``w``), bidirectional ``(-1, -1)``. Older torch releases have the kernel with a smaller
signature: 2.11 has ``scale`` and ``window_size`` but no ``enable_gqa`` (grouped KV heads are
repeated), earlier ones only ``is_causal`` (the softmax scale is folded into the query, a
sliding window falls back). The signature is read once, when the implementation is registered.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable
from itertools import pairwise
from typing import Any

import attrs
import torch
from torch.utils.weak import WeakIdKeyDictionary

from . import BIDIRECTIONAL_SPANS
from .counts import note_fallback, note_kernel
from .varlen import (
    context_parallel_aware,
    cu_bounds,
    packed_bounds,
    varlen_attention,
    varlen_mask,
)

#: The name ``[model] attn_implementation`` gives to :func:`flash_varlen_forward`.
FLASH_VARLEN = "flash_varlen"


@attrs.frozen
class Kernel:
    """A varlen kernel and the keywords its signature has (read once, outside any graph)."""

    fn: Callable[..., torch.Tensor]
    #: Half precision only (torch's flash kernel); fp32 inputs go to ``varlen``.
    half_only: bool = False
    window_size: bool = True
    scale: bool = True
    enable_gqa: bool = True

    @classmethod
    def of(cls, fn: Callable[..., torch.Tensor], *, half_only: bool = False) -> Kernel:
        """``fn``'s signature read: which keywords it takes (all, when it has none to read)."""
        try:
            names = frozenset(inspect.signature(fn).parameters)
        except (TypeError, ValueError):
            return cls(fn, half_only=half_only)
        return cls(
            fn,
            half_only=half_only,
            window_size="window_size" in names,
            scale="scale" in names,
            enable_gqa="enable_gqa" in names,
        )

    def __call__(
        self,
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
        kwargs: dict[str, Any] = {}
        if self.window_size:
            left = sliding_window - 1 if sliding_window is not None else -1
            kwargs["window_size"] = (left, 0) if causal else (-1, -1)
        else:  # torch 2.9-2.10; a sliding window went to `varlen` before this call
            kwargs["is_causal"] = causal
        if scale is not None:
            if self.scale:
                kwargs["scale"] = scale
            else:
                q = q * (scale * math.sqrt(q.shape[-1]))  # the kernel's own scale is 1/sqrt(dim)
        heads, kv_heads = q.shape[1], k.shape[1]
        if heads != kv_heads:
            if self.enable_gqa:
                kwargs["enable_gqa"] = True
            else:  # torch 2.11 and older: no grouped-query attention in the kernel
                k = k.repeat_interleave(heads // kv_heads, dim=1)
                v = v.repeat_interleave(heads // kv_heads, dim=1)
        return self.fn(q, k, v, cu_q, cu_k, longest_q, longest_k, **kwargs)


#: The kernel per device type, filled by :func:`register` (a property of the installed torch,
#: not of a run; tests replace entries).
KERNELS: dict[str, Kernel] = {}


def device_kernels() -> dict[str, Kernel]:
    """``{"cuda": torch's flash kernel (if this torch has it), "cpu": the reference op}``."""
    from .varlen_op import reference_kernel

    kernels = {"cpu": Kernel.of(reference_kernel)}
    try:
        from torch.nn.attention.varlen import varlen_attn
    except ImportError:  # torch < 2.9: the reference op on CUDA too (any dtype)
        kernels["cuda"] = kernels["cpu"]
    else:
        kernels["cuda"] = Kernel.of(varlen_attn, half_only=True)
    return kernels


def kernel_for(device_type: str) -> Kernel:
    """The kernel for ``device_type`` (the reference op where there is none of its own)."""
    if not KERNELS:
        KERNELS.update(device_kernels())
    return KERNELS.get(device_type) or KERNELS["cpu"]


def fallback_reason(
    kernel: Kernel,
    query: torch.Tensor,
    key: torch.Tensor,
    attention_mask: torch.Tensor | None,
    sliding_window: int | None,
    causal: bool,
) -> str | None:
    """Why this call cannot run ``kernel`` (None: it can)."""
    if attention_mask is not None:
        return "an attention mask (padded rows): SDPA with the mask"
    if query.shape[2] != key.shape[2]:
        return "queries and keys differ in length (a KV cache): SDPA"
    if kernel.half_only and query.dtype not in (torch.float16, torch.bfloat16):
        return (
            f"{query.dtype} inputs without autocast (the flash kernel needs bf16/fp16; "
            '[training] mixed_precision = "bf16"): per-sample SDPA'
        )
    if sliding_window is not None and causal and not kernel.window_size:
        return "a sliding window this torch's kernel cannot take: per-sample SDPA"
    return None


@torch.compiler.disable
def _fall_back(reason: str, *args: Any, **kwargs: Any) -> tuple[torch.Tensor, None]:
    note_fallback(reason)
    return varlen_attention(*args, **kwargs)


def _autocast(*tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """``tensors`` in the autocast dtype of their device, when autocast is on there."""
    device = tensors[0].device.type
    if not torch.is_autocast_enabled(device):
        return tensors
    dtype = torch.get_autocast_dtype(device)
    return tuple(t.to(dtype) for t in tensors)


#: Per boundary tensor (position_ids without cu_seq_lens, by identity and version): the int32
#: boundaries on the device and the longest segment, so a forward's layers share one copy.
_KERNEL_BOUNDS: WeakIdKeyDictionary = WeakIdKeyDictionary()


@torch.compiler.disable  # host work: the packed runtime gives cu_seq_lens, which needs none
def _boundaries(
    batch: int,
    length: int,
    device: torch.device,
    cu_seq_lens: torch.Tensor | None,
    position_ids: torch.Tensor | None,
) -> tuple[torch.Tensor, int]:
    """``(cu_seqlens int32 on device, longest segment)`` over the flattened ``batch·length``,
    for a call without ``max_length`` or without ``cu_seq_lens``."""
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


def _device_bounds(
    batch: int,
    length: int,
    device: torch.device,
    cu_seq_lens: torch.Tensor | None,
    longest: int | None,
    position_ids: torch.Tensor | None,
) -> tuple[torch.Tensor, int]:
    """The boundaries and longest sample: as given (no host work), whole rows when there
    are no boundaries, else read once per tensor on the host."""
    if cu_seq_lens is not None and longest is not None:
        return cu_seq_lens.to(device=device, dtype=torch.int32), longest
    if cu_seq_lens is None and position_ids is None:
        cu = torch.arange(0, (batch + 1) * length, length, dtype=torch.int32, device=device)
        return cu, length
    return _boundaries(batch, length, device, cu_seq_lens, position_ids)


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
    if dropout:
        raise ValueError("`flash_varlen` attention has no dropout; use `varlen` or `sdpa`")
    batch, heads, length, _ = query.shape
    causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    query, key, value = _autocast(query, key, value)
    kernel = kernel_for(query.device.type)
    reason = fallback_reason(kernel, query, key, attention_mask, sliding_window, causal)
    if reason is None and kwargs.get(BIDIRECTIONAL_SPANS) is not None:
        reason = "bidirectional spans (the flash kernel is causal or not): per-sample SDPA"
    if reason is not None:
        return _fall_back(
            reason,
            module,
            query,
            key,
            value,
            attention_mask,
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
    note_kernel()
    device = query.device
    cu_q, longest = _device_bounds(batch, length, device, cu_seq_lens_q, max_length_q, position_ids)
    cu_k, longest_k = cu_q, longest
    if cu_seq_lens_k is not None and cu_seq_lens_k is not cu_seq_lens_q:
        cu_k, longest_k = _device_bounds(batch, length, device, cu_seq_lens_k, max_length_k, None)

    def tokens(x: torch.Tensor) -> torch.Tensor:  # (B, H, L, D) -> (B·L, H, D)
        return x.transpose(1, 2).reshape(batch * length, x.shape[1], x.shape[-1])

    out = kernel(
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
    """Register :data:`FLASH_VARLEN` with transformers (idempotent), and read the kernels'
    signatures now, outside any compiled graph."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    kernel_for("cpu")
    if FLASH_VARLEN not in AttentionInterface._global_mapping:
        AttentionInterface.register(FLASH_VARLEN, flash_varlen_forward)
    if FLASH_VARLEN not in AttentionMaskInterface._global_mapping:
        AttentionMaskInterface.register(FLASH_VARLEN, varlen_mask)
