"""``flash_varlen`` calls torch's varlen kernel through the signature the installed torch has:
the current one (``scale``, ``window_size``, ``enable_gqa``), torch 2.11's (no ``enable_gqa``)
and the oldest (``is_causal`` only), with the math of ``varlen`` (per-sample SDPA) either way.
The kernel is stubbed by per-segment SDPA: there is no CUDA kernel on CPU."""

from __future__ import annotations

from itertools import pairwise
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from hyper_core.attention import flash_varlen
from hyper_core.attention.varlen import varlen_attention_forward


def _segments(q, k, v, cu_q, *, causal: bool, scale: float | None, gqa: bool) -> torch.Tensor:
    out = []
    for a, b in pairwise(cu_q.tolist()):
        qs, ks, vs = (x[a:b].transpose(0, 1) for x in (q, k, v))
        o = torch.nn.functional.scaled_dot_product_attention(
            qs, ks, vs, is_causal=causal, scale=scale, enable_gqa=gqa
        )
        out.append(o.transpose(0, 1))
    return torch.cat(out)


def current_kernel(calls: list[dict[str, Any]]) -> Any:
    def varlen_attn(
        q, k, v, cu_q, cu_k, max_q, max_k, *, scale=None, window_size=(-1, -1), enable_gqa=False
    ):
        calls.append({"window_size": window_size, "max_q": max_q, "heads": k.shape[1]})
        assert window_size in ((-1, 0), (-1, -1))
        causal = window_size == (-1, 0)
        return _segments(q, k, v, cu_q, causal=causal, scale=scale, gqa=enable_gqa)

    return varlen_attn


def torch_2_11_kernel(calls: list[dict[str, Any]]) -> Any:
    def varlen_attn(
        q, k, v, cu_q, cu_k, max_q, max_k, *, return_aux=None, scale=None, window_size=(-1, -1)
    ):
        calls.append({"window_size": window_size, "max_q": max_q, "heads": k.shape[1]})
        assert k.shape[1] == q.shape[1], "torch 2.11's kernel has no grouped-query attention"
        causal = window_size == (-1, 0)
        return _segments(q, k, v, cu_q, causal=causal, scale=scale, gqa=False)

    return varlen_attn


def old_kernel(calls: list[dict[str, Any]]) -> Any:
    def varlen_attn(q, k, v, cu_q, cu_k, max_q, max_k, is_causal=False):
        calls.append({"is_causal": is_causal, "max_q": max_q, "heads": k.shape[1]})
        assert k.shape[1] == q.shape[1], "the old kernel has no grouped-query attention"
        return _segments(q, k, v, cu_q, causal=is_causal, scale=None, gqa=False)

    return varlen_attn


def _inputs() -> tuple[torch.Tensor, ...]:
    torch.manual_seed(0)
    q = torch.randn(1, 4, 20, 8, requires_grad=True)  # (B, H, L, D), 2 KV heads: GQA
    k = torch.randn(1, 2, 20, 8, requires_grad=True)
    v = torch.randn(1, 2, 20, 8, requires_grad=True)
    return q, k, v


@pytest.mark.parametrize("make_kernel", [current_kernel, torch_2_11_kernel, old_kernel])
@pytest.mark.parametrize("causal", [True, False])
def test_both_signatures_compute_varlen(
    monkeypatch: pytest.MonkeyPatch, make_kernel: Any, causal: bool
) -> None:
    calls: list[dict[str, Any]] = []
    stub = make_kernel(calls)
    monkeypatch.setitem(flash_varlen.KERNELS, "cpu", flash_varlen.Kernel.of(stub))
    cu = torch.tensor([0, 5, 12, 20], dtype=torch.int32)
    module = SimpleNamespace(is_causal=causal)
    kwargs = {"scaling": 0.3, "cu_seq_lens_q": cu, "cu_seq_lens_k": cu, "is_causal": causal}

    q, k, v = _inputs()
    got, _ = flash_varlen.flash_varlen_forward(module, q, k, v, None, **kwargs)
    got.square().sum().backward()
    got_grads = [x.grad for x in (q, k, v)]

    q, k, v = _inputs()
    want, _ = varlen_attention_forward(module, q, k, v, None, **kwargs)
    want.square().sum().backward()

    assert len(calls) == 1 and calls[0]["max_q"] == 8
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    for g, x in zip(got_grads, (q, k, v)):
        torch.testing.assert_close(g, x.grad, atol=1e-5, rtol=1e-5)


def test_old_kernel_sliding_window_falls_back_to_varlen(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[dict[str, Any]] = []
    stub = old_kernel(calls)
    monkeypatch.setitem(flash_varlen.KERNELS, "cpu", flash_varlen.Kernel.of(stub))
    q, k, v = _inputs()
    cu = torch.tensor([0, 12, 20], dtype=torch.int32)
    module = SimpleNamespace(is_causal=True)
    kwargs = {"cu_seq_lens_q": cu, "sliding_window": 4}
    got, _ = flash_varlen.flash_varlen_forward(module, q, k, v, None, **kwargs)
    want, _ = varlen_attention_forward(module, q, k, v, None, **kwargs)
    assert calls == []  # the window cannot be given to this kernel
    torch.testing.assert_close(got, want)


def test_boundaries_reach_the_device_once_per_tensor(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every layer of a forward gets the same ``cu_seq_lens``: one host read for all of them."""
    reads: list[torch.Tensor] = []
    real = flash_varlen.cu_bounds
    monkeypatch.setattr(flash_varlen, "cu_bounds", lambda t: reads.append(t) or real(t))
    cu = torch.tensor([0, 5, 12, 20], dtype=torch.int32)
    first = flash_varlen._boundaries(1, 20, torch.device("cpu"), cu, None)
    second = flash_varlen._boundaries(1, 20, torch.device("cpu"), cu, None)
    assert len(reads) == 1 and first[0] is second[0] and first[1] == 8
    cu.add_(0)  # an in-place change bumps the version: read again
    flash_varlen._boundaries(1, 20, torch.device("cpu"), cu, None)
    assert len(reads) == 2


@pytest.mark.gpu
@pytest.mark.parametrize("causal", [True, False])
def test_real_kernel_matches_per_sample_sdpa_on_cuda(causal: bool) -> None:
    """torch's kernel itself, bf16 on CUDA, against per-sample SDPA in fp32 (GQA, a scale)."""
    torch.manual_seed(0)
    cu = torch.tensor([0, 100, 357, 380, 1024], dtype=torch.int32, device="cuda")
    module = SimpleNamespace(is_causal=causal)
    kwargs = {"scaling": 0.11, "cu_seq_lens_q": cu, "cu_seq_lens_k": cu, "is_causal": causal}
    base = [torch.randn(1, h, 1024, 64, device="cuda") for h in (8, 2, 2)]
    results = []
    for dtype, forward in (
        (torch.bfloat16, flash_varlen.flash_varlen_forward),
        (torch.float32, varlen_attention_forward),
    ):
        q, k, v = (x.to(dtype).requires_grad_() for x in base)
        out, _ = forward(module, q, k, v, None, **kwargs)
        out.float().square().sum().backward()
        results.append([out.float(), *(x.grad.float() for x in (q, k, v))])
    for got, want in zip(*results):
        torch.testing.assert_close(got, want, atol=5e-2, rtol=5e-2)


@pytest.mark.parametrize(
    ("window", "kv_heads"), [((-1, 0), 4), ((-1, -1), 2), ((2, 0), 2)], ids=str
)
def test_reference_op_gradients_are_attentions(window: tuple[int, int], kv_heads: int) -> None:
    """``hyper_train::varlen_attn``'s hand-written backward against numerical gradients
    (causal, bidirectional with grouped KV heads, a causal window of 3)."""
    from hyper_core.attention.varlen_op import varlen_attn

    torch.manual_seed(0)
    q = torch.randn(10, 4, 8, dtype=torch.float64, requires_grad=True)
    k, v = (torch.randn(10, kv_heads, 8, dtype=torch.float64, requires_grad=True) for _ in "kv")
    cu = torch.tensor([0, 4, 4, 10], dtype=torch.int32)  # an empty sample too

    def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return varlen_attn(q, k, v, cu, cu, 6, 6, 0.3, *window)

    assert torch.autograd.gradcheck(attend, (q, k, v))
