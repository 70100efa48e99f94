"""``flex_varlen``: flex attention over a packed row with a ``BlockMask`` of its samples,
bidirectional spans and sliding window computes what ``varlen``'s per-sample SDPA computes."""

from __future__ import annotations

import warnings
from itertools import pairwise

import pytest
import torch

from hyper_core.attention import BIDIRECTIONAL_SPANS
from hyper_core.attention.flex_varlen import flex_varlen_attention, row_mask_mod
from hyper_core.attention.varlen import segment_mask, varlen_attention
from hyper_core.batching.packed import boundary_kwargs

LENGTHS = [37, 60, 31]  # not multiples of flex's 128-token blocks
SPANS = [(5, 20), (40, 58), (70, 90), (100, 110)]  # row positions, inside the samples


class _Causal(torch.nn.Module):
    is_causal = True


def _qkv(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    n = sum(LENGTHS)
    return (
        torch.randn(1, 4, n, 16, generator=g),
        torch.randn(1, 2, n, 16, generator=g),
        torch.randn(1, 2, n, 16, generator=g),
    )


@pytest.mark.parametrize("window", [None, 12])
def test_the_mask_is_samples_causal_spans_and_window(window: int | None) -> None:
    bounds = [0, *torch.tensor(LENGTHS).cumsum(0).tolist()]
    mod = row_mask_mod(bounds, SPANS, window, "cpu")
    n = bounds[-1]
    q, kv = torch.arange(n)[:, None], torch.arange(n)[None, :]
    dense = mod(0, 0, q, kv)
    expected = torch.zeros(n, n, dtype=torch.bool)
    for a, b in pairwise(bounds):
        inside = [(s - a, e - a) for s, e in SPANS if a <= s and e <= b]
        expected[a:b, a:b] = segment_mask(b - a, inside, window, torch.device("cpu"))
    assert torch.equal(dense, expected)
    assert dense[6, 19] and not dense[4, 6]  # a span looks ahead, a token before it does not


@pytest.mark.parametrize("window", [None, 12])
def test_flex_equals_per_sample_sdpa(window: int | None) -> None:
    q, k, v = _qkv()
    kwargs = {**boundary_kwargs(LENGTHS), BIDIRECTIONAL_SPANS: torch.tensor(SPANS)}
    module = _Causal()
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # flex without compile on CPU: unfused, says so
        got, _ = flex_varlen_attention(module, q, k, v, None, sliding_window=window, **kwargs)
        want, _ = varlen_attention(module, q, k, v, None, sliding_window=window, **kwargs)
        causal, _ = varlen_attention(
            module, q, k, v, None, sliding_window=window, **boundary_kwargs(LENGTHS)
        )
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    assert (got - causal).abs().max() > 1e-3  # the spans change the result


def test_a_cpu_backward_takes_varlen() -> None:
    """torch's flex attention has no CPU backward: training on CPU gets varlen's gradients."""
    q, k, v = (x.requires_grad_() for x in _qkv(1))
    kwargs = {**boundary_kwargs(LENGTHS), BIDIRECTIONAL_SPANS: torch.tensor(SPANS)}
    out, _ = flex_varlen_attention(_Causal(), q, k, v, None, **kwargs)
    out.square().sum().backward()
    grads = [x.grad.clone() for x in (q, k, v)]
    for x in (q, k, v):
        x.grad = None
    ref, _ = varlen_attention(_Causal(), q, k, v, None, **kwargs)
    ref.square().sum().backward()
    for got, want in zip(grads, (q.grad, k.grad, v.grad)):
        torch.testing.assert_close(got, want)
