"""``varlen`` attention: ``scaled_dot_product_attention`` once per sample of a packed row.

The sample boundaries come from ``cu_seq_lens_q``/``cu_seq_lens_k`` (cumulative lengths over
the ``B·L`` tokens flattened, flash-attention's convention; the packed runtime adds them) or,
without them, from ``position_ids`` restarting, where transformers' SDPA mask finds them too.
Attention is causal within a sample unless the module says ``is_causal=False`` (vision towers),
with the layer's sliding window if it has one; the spans of
:data:`~hyper_core.attention.BIDIRECTIONAL_SPANS` (Gemma 3's image tokens) attend to each other
both ways, the sample's segment then getting a dense mask. Everything else that needs a real
mask (padding, a cache, mask overlays) gets transformers' SDPA mask and SDPA itself, so
``varlen`` computes what ``sdpa`` computes, at Σ nᵢ² instead of (Σ nᵢ)² on a packed row,
without the dense mask.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from itertools import pairwise
from typing import Any

import torch
from torch.utils.weak import WeakIdKeyDictionary

from . import BIDIRECTIONAL_SPANS, VARLEN

#: The keyword argument with which ``[parallel] cp`` calls the attention function of a module
#: that holds this rank's share of a row's tokens (a forward pre-hook of the module adds it in
#: training): its object's ``attention`` runs this function over the whole row
#: (:class:`hyper_core.parallel.context_parallel.ContextParallel`).
CONTEXT_PARALLEL_KWARG = "hyper_context_parallel"

# Boundaries as Python ints, per tensor (by identity, checked against its version): every layer
# of one forward gets the same cu_seq_lens/position_ids tensor, so the device→host copy (a sync
# on GPU) happens once per forward, not once per layer.
_CU_BOUNDS: WeakIdKeyDictionary = WeakIdKeyDictionary()
_POSITION_BOUNDS: WeakIdKeyDictionary = WeakIdKeyDictionary()
_SPANS: WeakIdKeyDictionary = WeakIdKeyDictionary()


def _cached(
    cache: WeakIdKeyDictionary, tensor: torch.Tensor, compute: Callable[[], list[int] | None]
) -> list[int] | None:
    hit = cache.get(tensor)
    if hit is not None and hit[0] == tensor._version:
        return hit[1]
    value = compute()
    cache[tensor] = (tensor._version, value)
    return value


def cu_bounds(cu_seq_lens: torch.Tensor) -> list[int]:
    """``cu_seq_lens`` as a list of ints (cached per tensor)."""
    return _cached(_CU_BOUNDS, cu_seq_lens, lambda: [int(x) for x in cu_seq_lens.tolist()])


def span_list(spans: torch.Tensor) -> list[tuple[int, int]]:
    """A ``(n, 2)`` spans tensor as ``[(start, end), ...]`` (cached per tensor)."""
    found = _cached(_SPANS, spans, lambda: [int(x) for x in spans.reshape(-1).tolist()])
    assert found is not None
    return list(zip(found[0::2], found[1::2], strict=True))


def check_spans(spans: list[tuple[int, int]], bounds: list[int]) -> None:
    """``ValueError`` unless each span lies inside one segment of ``bounds``."""
    if spans and not all(any(a >= lo and b <= hi for lo, hi in pairwise(bounds)) for a, b in spans):
        raise ValueError(f"{BIDIRECTIONAL_SPANS}: a span crosses a sample boundary")


def segment_mask(
    n: int,
    spans: list[tuple[int, int]],
    sliding_window: int | None,
    device: torch.device,
) -> torch.Tensor:
    """The ``(n, n)`` boolean mask of a causal segment whose ``spans`` (segment-relative
    ``[start, end)``) attend both ways: ``(causal or same span) and within the window``, as
    transformers composes its ``token_type_ids`` block mask with a sliding window."""
    i = torch.arange(n, device=device)
    diff = i[:, None] - i[None, :]
    mask = diff >= 0
    span_id = torch.full((n,), -1, dtype=torch.long, device=device)
    for k, (a, b) in enumerate(spans):
        span_id[a:b] = k
    mask |= (span_id[:, None] == span_id[None, :]) & (span_id[:, None] >= 0)
    if sliding_window is not None:
        mask &= diff < sliding_window
    return mask


def packed_bounds(position_ids: torch.Tensor, batch: int, length: int) -> list[int] | None:
    """Segment starts over the flattened ``batch·length`` tokens where positions do not go up
    by one (plus the end), or None when each row is one sequence (or the shape does not fit)."""
    if position_ids.shape[-1] != length:
        return None
    rows = position_ids.reshape(-1, length)
    if rows.shape[0] == 1 and batch > 1:
        rows = rows.expand(batch, -1)
    if rows.shape[0] != batch:
        return None

    def compute() -> list[int] | None:
        starts = torch.ones(rows.shape, dtype=torch.bool, device=rows.device)
        starts[:, 1:] = rows[:, 1:] != rows[:, :-1] + 1
        idx = starts.flatten().nonzero().flatten().tolist()
        return None if len(idx) == batch else [*idx, batch * length]

    return _cached(_POSITION_BOUNDS, position_ids, compute)


def _flatten(x: torch.Tensor) -> torch.Tensor:
    """(B, H, L, D) -> (1, H, B·L, D); a view when B == 1."""
    b, h, n, d = x.shape
    return x if b == 1 else x.transpose(0, 1).reshape(1, h, b * n, d)


def segment_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    q_bounds: list[int],
    k_bounds: list[int],
    *,
    causal: bool,
    dropout: float = 0.0,
    scaling: float | None = None,
    sliding_window: int | None = None,
    spans: list[tuple[int, int]] = (),  # type: ignore[assignment]
) -> torch.Tensor:
    """SDPA of each segment ``[q_bounds[i], q_bounds[i+1])`` against its keys; (B, L, H, Dv).

    ``spans``: ``[start, end)`` token ranges of the flattened row that attend both ways (each
    inside one causal segment); a segment holding one gets a dense :func:`segment_mask`."""
    batch, heads, q_len, _ = query.shape
    if len(q_bounds) != len(k_bounds):
        raise ValueError(
            f"cu_seq_lens_q has {len(q_bounds) - 1} segments, cu_seq_lens_k {len(k_bounds) - 1}"
        )
    for name, bounds, x in (("q", q_bounds, query), ("k", k_bounds, key)):
        if bounds[0] != 0 or bounds[-1] != x.shape[0] * x.shape[2]:
            raise ValueError(
                f"cu_seq_lens_{name} spans {bounds[0]}..{bounds[-1]}, the attention has "
                f"{x.shape[0] * x.shape[2]} tokens (batch × length)"
            )
    q_sizes = [b - a for a, b in pairwise(q_bounds)]
    k_sizes = [b - a for a, b in pairwise(k_bounds)]
    if min(q_sizes + k_sizes, default=0) < 0:
        raise ValueError("cu_seq_lens must not decrease")
    # One split per tensor, not a slice per segment: each slice's backward would write a
    # zero-filled gradient of the whole row.
    qs = _flatten(query).split(q_sizes, dim=2)
    ks = _flatten(key).split(k_sizes, dim=2)
    vs = _flatten(value).split(k_sizes, dim=2)
    gqa = heads != key.shape[1]
    outputs = []
    for start, q, k, v, n, m in zip(q_bounds, qs, ks, vs, q_sizes, k_sizes):
        if n == 0:
            continue
        if causal and m != n:
            raise ValueError(f"causal segment with {n} queries and {m} keys")
        mask = None
        is_causal = causal
        inside = [(a - start, b - start) for a, b in spans if start <= a and b <= start + n]
        if causal and inside:
            mask = segment_mask(n, inside, sliding_window, query.device)
            is_causal = False
        elif causal and sliding_window is not None and n > sliding_window:
            i = torch.arange(n, device=query.device)
            diff = i[:, None] - i[None, :]
            mask = (diff >= 0) & (diff < sliding_window)
            is_causal = False
        out = torch.nn.functional.scaled_dot_product_attention(
            q,
            k,
            v,
            attn_mask=mask,
            dropout_p=dropout,
            is_causal=is_causal,
            scale=scaling,
            enable_gqa=gqa,
        )
        outputs.append(out.transpose(1, 2))
    return torch.cat(outputs, dim=1).reshape(batch, q_len, heads, value.shape[-1])


# Under ``[training] compile`` the per-sample loop runs eagerly (a graph break around attention):
# traced, every sample boundary would be a symbolic int, recompiling per packing and, with many
# samples per row, generating code inductor cannot compile.
@torch.compiler.disable
def varlen_attention(
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
    """transformers' attention-function signature; ``(B, L, H, Dv)`` output, no weights
    (the rows as given: :func:`varlen_attention_forward` adds ``[parallel] cp``)."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    batch, _, q_len, _ = query.shape
    causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    bounds: tuple[list[int], list[int]] | None = None
    spans = kwargs.pop(BIDIRECTIONAL_SPANS, None)
    if spans is not None and cu_seq_lens_q is not None and q_len == key.shape[2]:
        # A packed training row with declared spans: its mask is causal + spans (+ window) per
        # sample; a dense mask transformers built from its overlays says the same (or, packed,
        # indexes them wrongly: Gemma 3's sliding layers), so it is not used.
        attention_mask = None
    if attention_mask is None and q_len == key.shape[2]:
        if cu_seq_lens_q is not None:
            q_bounds = cu_bounds(cu_seq_lens_q)
            k_bounds = q_bounds if cu_seq_lens_k is None else cu_bounds(cu_seq_lens_k)
            bounds = (q_bounds, k_bounds)
        elif position_ids is not None and (found := packed_bounds(position_ids, batch, q_len)):
            bounds = (found, found)
        elif causal and sliding_window is not None and q_len > sliding_window:
            rows = [b * q_len for b in range(batch + 1)]
            bounds = (rows, rows)
    if bounds is None:
        return sdpa_attention_forward(
            module,
            query,
            key,
            value,
            attention_mask,
            dropout=dropout,
            scaling=scaling,
            is_causal=is_causal,
            **kwargs,
        )
    if kwargs.get("softcap") is not None:
        raise ValueError("`varlen` attention does not support `softcap`; use `eager`")
    found = span_list(spans) if spans is not None else []
    check_spans(found, bounds[0])
    out = segment_attention(
        query,
        key,
        value,
        *bounds,
        causal=causal,
        dropout=dropout,
        scaling=scaling,
        sliding_window=sliding_window,
        spans=found,
    )
    return out, None


AttentionFn = Callable[..., tuple[torch.Tensor, Any]]


def context_parallel_aware(fn: AttentionFn) -> AttentionFn:
    """``fn`` that, called with :data:`CONTEXT_PARALLEL_KWARG` (an attention module holding
    this rank's share of a row: ``[parallel] cp``, training), runs over the whole row through
    the group's Ulysses exchange
    (:meth:`hyper_core.parallel.context_parallel.ContextParallel.attention`)."""

    @functools.wraps(fn)
    def attention(
        module: torch.nn.Module,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        attention_mask: torch.Tensor | None,
        **kwargs: Any,
    ) -> tuple[torch.Tensor, Any]:
        cp = kwargs.pop(CONTEXT_PARALLEL_KWARG, None)
        if cp is not None and module.training:
            return cp.attention(fn, module, query, key, value, attention_mask, **kwargs)
        return fn(module, query, key, value, attention_mask, **kwargs)

    return attention


#: ``varlen`` as registered with transformers: :func:`varlen_attention`, context-parallel aware.
varlen_attention_forward = context_parallel_aware(varlen_attention)


def varlen_mask(
    batch_size: int,
    q_length: int,
    kv_length: int,
    q_offset: Any = 0,
    kv_offset: Any = 0,
    mask_function: Callable | None = None,
    attention_mask: torch.Tensor | None = None,
    use_vmap: bool = False,
    **kwargs: Any,
) -> torch.Tensor | None:
    """transformers' mask-interface signature: None (no mask) for an unpadded, cache-free
    forward, packed or not, which :func:`varlen_attention_forward` handles by segments;
    otherwise SDPA's mask, for SDPA."""
    from transformers.masking_utils import causal_mask_function, sdpa_mask

    if (
        attention_mask is None
        and not use_vmap  # custom mask functions (image overlays) need the real mask
        and q_length == kv_length
        and isinstance(q_offset, int)
        and isinstance(kv_offset, int)
        and q_offset == kv_offset == 0
    ):
        return None
    return sdpa_mask(
        batch_size=batch_size,
        q_length=q_length,
        kv_length=kv_length,
        q_offset=q_offset,
        kv_offset=kv_offset,
        mask_function=mask_function or causal_mask_function,
        attention_mask=attention_mask,
        use_vmap=use_vmap,
        **kwargs,
    )


def register() -> None:
    """Register :data:`~hyper_core.attention.VARLEN` with transformers, unless it already is
    (a wrapper registered under the name stays)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    if VARLEN not in AttentionInterface._global_mapping:
        AttentionInterface.register(VARLEN, varlen_attention_forward)
    if VARLEN not in AttentionMaskInterface._global_mapping:
        AttentionMaskInterface.register(VARLEN, varlen_mask)
