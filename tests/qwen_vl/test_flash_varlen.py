"""``attn_implementation = "flash_varlen"``: with the kernel (stubbed here by per-segment SDPA,
as on CPU there is no CUDA kernel) the vision tower and the decoder each make one attention
call per layer per forward (no loop over windows, images or samples), with the same loss and
gradients as ``sdpa``; on CPU it is ``varlen``."""

from __future__ import annotations

from itertools import pairwise
from typing import Any

import attrs
import pytest
import torch

from hyper_core.attention import flash_varlen
from hyper_core.testing.vl import (
    loss_and_grads,
    micro_batch,
    tiny_vl,
    vl_samples,
    write_test_images,
)


def _stub(calls: list[int]) -> Any:
    def varlen_attn(
        q, k, v, cu_q, cu_k, max_q, max_k, *, scale=None, window_size=(-1, -1), enable_gqa=False
    ):
        calls.append(len(cu_q) - 1)
        bounds = cu_q.tolist()
        causal = window_size == (-1, 0)
        assert window_size in ((-1, 0), (-1, -1)), window_size
        assert max_q == max(b - a for a, b in pairwise(bounds))
        out = []
        for a, b in pairwise(bounds):
            qs, ks, vs = (x[a:b].transpose(0, 1) for x in (q, k, v))
            o = torch.nn.functional.scaled_dot_product_attention(
                qs, ks, vs, is_causal=causal, scale=scale, enable_gqa=enable_gqa
            )
            out.append(o.transpose(0, 1))
        return torch.cat(out)

    return varlen_attn


@pytest.mark.parametrize("family", ["qwen2_vl", "qwen2_5_vl", "qwen3_vl"])
def test_one_call_per_layer_and_the_sdpa_loss(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch, family: str
) -> None:
    adapter, reference, assets = tiny_vl(tmp_path, family, "sdpa")
    images = write_test_images(tmp_path / "images")
    samples = vl_samples(images)[:3]
    feats = [adapter.transform(s, assets, max_seq_len=4096) for s in samples]
    mb = micro_batch(feats, "packed", assets.pad_token_id, varlen_kwargs=True)
    want = loss_and_grads(reference, micro_batch(feats, "packed", assets.pad_token_id))

    _, model, _ = tiny_vl(tmp_path, family, "flash_varlen")
    calls: list[int] = []
    monkeypatch.setitem(flash_varlen.KERNELS, "cpu", flash_varlen.Kernel.of(_stub(calls)))
    got = loss_and_grads(model, mb)

    text, vision = model.config.text_config, model.config.vision_config
    assert len(calls) == text.num_hidden_layers + vision.depth  # one call per layer
    assert calls[-1] == len(samples)  # the decoder saw every sample's boundaries
    assert got[0] == pytest.approx(want[0], abs=1e-5)
    for name, grad in want[1].items():
        torch.testing.assert_close(got[1][name], grad, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("family", ["qwen2_vl", "qwen2_5_vl", "qwen3_vl"])
def test_under_bf16_autocast_every_layer_calls_the_kernel_in_bf16(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch, family: str
) -> None:
    """fp32 master weights under bf16 autocast: the rotary embedding leaves q and k in fp32,
    and still every decoder layer and vision block makes exactly one kernel call, in bf16
    (the kernel has no fp32: before, these calls fell back to per-sample SDPA, silently)."""
    from hyper_core.attention.counts import AttentionCounts, counting

    adapter, model, assets = tiny_vl(tmp_path, family, "flash_varlen")
    images = write_test_images(tmp_path / "images")
    feats = [adapter.transform(s, assets, max_seq_len=4096) for s in vl_samples(images)[:3]]
    mb = micro_batch(feats, "packed", assets.pad_token_id, varlen_kwargs=True)
    dtypes: list[tuple[torch.dtype, ...]] = []
    stub = _stub([])

    def bf16_only(q, k, v, *args: Any, **kwargs: Any) -> torch.Tensor:
        dtypes.append((q.dtype, k.dtype, v.dtype))
        return stub(q, k, v, *args, **kwargs)

    kernel = flash_varlen.Kernel.of(stub, half_only=True)
    monkeypatch.setitem(flash_varlen.KERNELS, "cpu", attrs.evolve(kernel, fn=bf16_only))
    assert all(p.dtype == torch.float32 for p in model.parameters())
    with counting(AttentionCounts()) as counts, torch.autocast("cpu", dtype=torch.bfloat16):
        loss_and_grads(model, mb)

    text, vision = model.config.text_config, model.config.vision_config
    assert len(dtypes) == text.num_hidden_layers + vision.depth
    assert set(dtypes) == {(torch.bfloat16,) * 3}
    assert (counts.kernel_calls, counts.fallback_calls) == (len(dtypes), 0)


def test_fp32_without_autocast_falls_back_counted_and_logged_once(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A half-precision-only kernel (CUDA's) with fp32 inputs: every layer falls back, each
    counted, the reason logged once."""
    from hyper_core.attention.counts import AttentionCounts, counting

    adapter, model, assets = tiny_vl(tmp_path, attn_implementation="flash_varlen")
    images = write_test_images(tmp_path / "images")
    feats = [adapter.transform(s, assets, max_seq_len=4096) for s in vl_samples(images)[:2]]
    mb = micro_batch(feats, "packed", assets.pad_token_id, varlen_kwargs=True)
    calls: list[int] = []
    kernel = flash_varlen.Kernel.of(_stub(calls), half_only=True)
    monkeypatch.setitem(flash_varlen.KERNELS, "cpu", kernel)
    with counting(AttentionCounts()) as counts, caplog.at_level("WARNING", "hyper_train"):
        loss_and_grads(model, mb)
    text, vision = model.config.text_config, model.config.vision_config
    assert calls == []
    assert counts.fallback_calls == text.num_hidden_layers + vision.depth
    [reason] = counts.fallbacks
    assert "torch.float32" in reason and "mixed_precision" in reason
    assert [r.getMessage() for r in caplog.records].count(
        f"flash_varlen: attention falls back from the kernel: {reason}"
    ) == 1
    assert counts.metrics()["attn/fallback_calls"] == counts.fallback_calls


def test_on_cpu_it_is_varlen(tmp_path: Any) -> None:
    adapter, model, assets = tiny_vl(tmp_path, attn_implementation="flash_varlen")
    _, reference, _ = tiny_vl(tmp_path, attn_implementation="varlen")
    images = write_test_images(tmp_path / "images")
    feats = [adapter.transform(s, assets, max_seq_len=4096) for s in vl_samples(images)[:2]]
    mb = micro_batch(feats, "packed", assets.pad_token_id, varlen_kwargs=True)
    assert loss_and_grads(model, mb)[0] == loss_and_grads(reference, mb)[0]


@pytest.mark.gpu
def test_real_kernel_gives_the_sdpa_loss_on_cuda(tmp_path: Any) -> None:
    """Tiny Qwen2.5-VL in bf16 on CUDA: torch's varlen kernel against SDPA, loss and grads."""
    results = []
    for implementation, varlen_kwargs in (("flash_varlen", True), ("sdpa", False)):
        adapter, model, assets = tiny_vl(tmp_path, attn_implementation=implementation)
        model.to("cuda", torch.bfloat16)
        images = write_test_images(tmp_path / "images")
        feats = [adapter.transform(s, assets, max_seq_len=4096) for s in vl_samples(images)[:3]]
        runtime_mb = micro_batch(feats, "packed", assets.pad_token_id, varlen_kwargs=varlen_kwargs)
        model_inputs, loss_inputs = (
            {k: v.to("cuda") if isinstance(v, torch.Tensor) else v for k, v in d.items()}
            for d in (runtime_mb.model_inputs, runtime_mb.loss_inputs)
        )
        runtime_mb.model_inputs, runtime_mb.loss_inputs = model_inputs, loss_inputs
        results.append(loss_and_grads(model, runtime_mb))
    (loss, grads), (want_loss, want_grads) = results
    assert loss == pytest.approx(want_loss, rel=2e-2)
    for name, grad in want_grads.items():
        cos = torch.nn.functional.cosine_similarity(
            grads[name].float().flatten(), grad.float().flatten(), dim=0
        )
        assert cos > 0.98, (name, float(cos))
