"""``hyper_train::varlen_attn``: variable-length attention as one registered custom op.

The op takes a packed row the way torch's CUDA kernel (``torch.nn.attention.varlen``) does:
``(tokens, heads, dim)`` query/key/value, the sample boundaries as a device tensor
(``cu_seq_q``/``cu_seq_k``, int32, cumulative) and the longest sample as an int. Its body is
the per-sample SDPA of :func:`.varlen.segment_attention`, so it computes what ``varlen``
computes, on any device and in any dtype; it is what ``flash_varlen`` calls where torch has
no flash kernel (CPU, fp32), and the reference its CUDA path is tested against.

Why an op and not the Python loop: ``torch.compile`` sees one opaque call with a fake
(shape-only) implementation, so a compiled decoder layer or vision block has no graph break
and no host work around attention; the boundaries are read on the host inside the op's body,
which the compiler never traces. The backward op recomputes each sample's attention
probabilities from q and k (only q, k and v are saved, as a flash kernel saves) and applies
softmax attention's gradient formulas in fp32.
"""

from __future__ import annotations

from itertools import pairwise

import torch

from .varlen import segment_attention

#: The op's qualified name: ``torch.ops.hyper_train.varlen_attn``.
OP_NAME = "hyper_train::varlen_attn"


def _window(causal_left: int, right: int) -> tuple[bool, int | None]:
    """``(causal, sliding_window)`` of a flash-style window: ``(-1, 0)`` causal,
    ``(w - 1, 0)`` causal with a window of ``w``, ``(-1, -1)`` bidirectional."""
    if right == 0:
        return True, (causal_left + 1 if causal_left >= 0 else None)
    if (causal_left, right) == (-1, -1):
        return False, None
    raise ValueError(f"window_size ({causal_left}, {right}) is not supported")


def _attend(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_q: torch.Tensor,
    cu_k: torch.Tensor,
    scale: float | None,
    window_left: int,
    window_right: int,
) -> torch.Tensor:
    """``(T, H, D)`` inputs → ``(T, H, Dv)`` by per-sample SDPA."""
    causal, sliding = _window(window_left, window_right)
    q_bounds = [int(x) for x in cu_q.tolist()]
    k_bounds = q_bounds if cu_k is cu_q else [int(x) for x in cu_k.tolist()]
    out = segment_attention(
        q.transpose(0, 1).unsqueeze(0),  # (1, H, T, D)
        k.transpose(0, 1).unsqueeze(0),
        v.transpose(0, 1).unsqueeze(0),
        q_bounds,
        k_bounds,
        causal=causal,
        scaling=scale,
        sliding_window=sliding,
    )
    return out.squeeze(0)  # (T, H, Dv)


@torch.library.custom_op(OP_NAME, mutates_args=())
def varlen_attn(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    cu_seq_q: torch.Tensor,
    cu_seq_k: torch.Tensor,
    max_q: int,
    max_k: int,
    scale: float | None = None,
    window_left: int = -1,
    window_right: int = 0,
) -> torch.Tensor:
    """Attention of each sample ``[cu_seq_q[i], cu_seq_q[i+1])`` against its keys; grouped
    key/value heads are shared by ``heads / kv_heads`` query heads. ``max_q``/``max_k`` are
    the flash kernel's (unused here, kept so both paths take the same arguments)."""
    return _attend(query, key, value, cu_seq_q, cu_seq_k, scale, window_left, window_right)


@varlen_attn.register_fake
def _varlen_attn_fake(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    cu_seq_q: torch.Tensor,
    cu_seq_k: torch.Tensor,
    max_q: int,
    max_k: int,
    scale: float | None = None,
    window_left: int = -1,
    window_right: int = 0,
) -> torch.Tensor:
    return query.new_empty((query.shape[0], query.shape[1], value.shape[-1]))


def _segment_grads(
    grad: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    scale: float,
    causal: bool,
    sliding_window: int | None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Attention's gradients for one sample, ``(n, H, D)`` tensors, in fp32: with ``P =
    softmax(scale·QKᵀ)``, ``dV = Pᵀ·dO``, ``dS = P ⊙ (dO·Vᵀ − rowsum(dO ⊙ O))``, ``dQ =
    scale·dS·K``, ``dK = scale·dSᵀ·Q``; grouped key/value heads sum their query heads'."""
    n, heads, _ = q.shape
    kv_heads = k.shape[1]
    group = heads // kv_heads
    qf, gf = q.float().transpose(0, 1), grad.float().transpose(0, 1)  # (H, n, D)
    kf = k.float().transpose(0, 1).repeat_interleave(group, dim=0)
    vf = v.float().transpose(0, 1).repeat_interleave(group, dim=0)
    scores = scale * qf @ kf.transpose(1, 2)  # (H, n, m)
    if causal:
        i = torch.arange(n, device=q.device)
        diff = i[:, None] - i[None, :]
        allowed = diff >= 0
        if sliding_window is not None:
            allowed &= diff < sliding_window
        scores = scores.masked_fill(~allowed, float("-inf"))
    p = scores.softmax(dim=-1)
    out = p @ vf
    dv = p.transpose(1, 2) @ gf
    ds = p * (gf @ vf.transpose(1, 2) - (gf * out).sum(-1, keepdim=True))
    dq = scale * ds @ kf
    dk = scale * ds.transpose(1, 2) @ qf

    def kv(x: torch.Tensor) -> torch.Tensor:  # (H, m, D) -> (m, H_kv, D), groups summed
        return x.reshape(kv_heads, group, *x.shape[1:]).sum(1).transpose(0, 1)

    return dq.transpose(0, 1), kv(dk), kv(dv)


@torch.library.custom_op("hyper_train::varlen_attn_backward", mutates_args=())
def varlen_attn_backward(
    grad: torch.Tensor,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    cu_seq_q: torch.Tensor,
    cu_seq_k: torch.Tensor,
    scale: float | None,
    window_left: int,
    window_right: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Gradients of :func:`varlen_attn` for q, k, v, sample by sample (fp32 inside)."""
    causal, sliding = _window(window_left, window_right)
    scale = scale if scale is not None else query.shape[-1] ** -0.5
    q_bounds = [int(x) for x in cu_seq_q.tolist()]
    k_bounds = [int(x) for x in cu_seq_k.tolist()]
    dq, dk, dv = (torch.zeros_like(x) for x in (query, key, value))
    for (a, b), (c, d) in zip(pairwise(q_bounds), pairwise(k_bounds)):
        if b == a:
            continue
        gq, gk, gv = _segment_grads(
            grad[a:b], query[a:b], key[c:d], value[c:d], scale, causal, sliding
        )
        dq[a:b], dk[c:d], dv[c:d] = gq, gk, gv
    return dq, dk, dv


@varlen_attn_backward.register_fake
def _varlen_attn_backward_fake(
    grad: torch.Tensor,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    cu_seq_q: torch.Tensor,
    cu_seq_k: torch.Tensor,
    scale: float | None,
    window_left: int,
    window_right: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return torch.empty_like(query), torch.empty_like(key), torch.empty_like(value)


def _setup_context(ctx: torch.autograd.function.FunctionCtx, inputs: tuple, output: object) -> None:
    query, key, value, cu_seq_q, cu_seq_k, _, _, scale, window_left, window_right = inputs
    ctx.save_for_backward(query, key, value, cu_seq_q, cu_seq_k)
    ctx.scale, ctx.window = scale, (window_left, window_right)


def _backward(ctx: torch.autograd.function.FunctionCtx, grad: torch.Tensor) -> tuple:
    query, key, value, cu_seq_q, cu_seq_k = ctx.saved_tensors
    dq, dk, dv = varlen_attn_backward(
        grad.contiguous(), query, key, value, cu_seq_q, cu_seq_k, ctx.scale, *ctx.window
    )
    return dq, dk, dv, None, None, None, None, None, None, None


varlen_attn.register_autograd(_backward, setup_context=_setup_context)


def reference_kernel(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    cu_seq_q: torch.Tensor,
    cu_seq_k: torch.Tensor,
    max_q: int,
    max_k: int,
    *,
    scale: float | None = None,
    window_size: tuple[int, int] = (-1, -1),
    enable_gqa: bool = False,
) -> torch.Tensor:
    """:func:`varlen_attn` with the keyword signature of torch's ``varlen_attn`` (grouped
    heads are always allowed), so ``flash_varlen`` calls either the same way."""
    left, right = window_size
    return varlen_attn(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, scale, left, right)
