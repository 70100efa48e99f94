"""``varlen`` attention: SDPA per packed sample = SDPA over the masked row, and its wiring."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import repeat_kv, sdpa_attention_forward
from transformers.masking_utils import sdpa_mask

from hyper_core.attention import VARLEN, register, uses_varlen_kwargs
from hyper_core.attention.varlen import varlen_attention_forward, varlen_mask
from hyper_core.batching.base import BatchingOptions
from hyper_core.batching.packed import PackedRuntime
from hyper_core.batching.padded import PaddedRuntime
from hyper_core.batching.resolve import resolve_runtime
from hyper_core.batching.types import IGNORE_INDEX, SampleFeatures
from hyper_core.builtin.hf_causal_lm import HFCausalLMAdapter
from hyper_core.config.schema import ModelConfig
from hyper_core.testing import isolated_host, run_tiny_training, tiny_text_config
from hyper_core.testing.vl import loss_and_grads, loss_of, micro_batch

register()


class Attn(torch.nn.Module):
    """What transformers' attention functions read from the calling module."""

    def __init__(self, heads: int, kv_heads: int, *, causal: bool = True) -> None:
        super().__init__()
        self.is_causal = causal
        self.num_key_value_groups = heads // kv_heads


def qkv(batch: int, length: int, heads: int = 4, kv_heads: int = 2, dim: int = 8) -> list:
    g = torch.Generator().manual_seed(0)
    shapes = [
        (batch, heads, length, dim),
        (batch, kv_heads, length, dim),
        (batch, kv_heads, length, dim),
    ]
    return [torch.randn(s, generator=g, dtype=torch.float64).requires_grad_() for s in shapes]


def reference(q, k, v, segments, *, causal: bool, window: int | None = None) -> torch.Tensor:
    """Dense softmax attention with a block-diagonal (causal, windowed) mask; (B, L, H, D)."""
    rep = q.shape[1] // k.shape[1]
    k, v = repeat_kv(k, rep), repeat_kv(v, rep)
    seg = segments[:, None, :, None] == segments[:, None, None, :]  # (B, 1, L, L)
    i = torch.arange(q.shape[2])
    diff = i[:, None] - i[None, :]
    if causal:
        seg = seg & (diff >= 0)
    if window is not None:
        seg = seg & (diff < window)
    scores = (q @ k.transpose(-1, -2)) * q.shape[-1] ** -0.5
    out = scores.masked_fill(~seg, float("-inf")).softmax(-1) @ v
    return out.transpose(1, 2)


def segment_ids(lengths: list[list[int]]) -> torch.Tensor:
    return torch.stack(
        [torch.repeat_interleave(torch.arange(len(row)), torch.tensor(row)) for row in lengths]
    )


def cu_of(lengths: list[int]) -> torch.Tensor:
    return torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)


def grads(out: torch.Tensor, tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    weight = torch.linspace(-1, 1, out.numel(), dtype=out.dtype).view_as(out)
    return list(torch.autograd.grad((out * weight).sum(), tensors))


# -- the attention function --------------------------------------------------------------------


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize(("heads", "kv_heads"), [(4, 4), (4, 2), (4, 1)])
def test_segments_equal_block_diagonal_attention(causal: bool, heads: int, kv_heads: int) -> None:
    lengths = [5, 1, 9, 3]
    q, k, v = qkv(1, sum(lengths), heads, kv_heads)
    cu = cu_of(lengths)
    out, weights = varlen_attention_forward(
        Attn(heads, kv_heads, causal=causal), q, k, v, None, cu_seq_lens_q=cu, cu_seq_lens_k=cu
    )
    ref = reference(q, k, v, segment_ids([lengths]), causal=causal)
    assert weights is None and out.shape == (1, sum(lengths), heads, 8)
    torch.testing.assert_close(out, ref, atol=1e-10, rtol=1e-10)
    for a, b in zip(grads(out, [q, k, v]), grads(ref, [q, k, v])):
        torch.testing.assert_close(a, b, atol=1e-10, rtol=1e-10)


def test_is_causal_argument_overrides_the_module() -> None:
    lengths = [4, 6]
    q, k, v = qkv(1, 10)
    cu = cu_of(lengths)
    out, _ = varlen_attention_forward(
        Attn(4, 2, causal=True), q, k, v, None, is_causal=False, cu_seq_lens_q=cu
    )
    torch.testing.assert_close(out, reference(q, k, v, segment_ids([lengths]), causal=False))


def test_batch_rows_are_flattened_like_flash_attention() -> None:
    """cu_seq_lens count over the B·L tokens: row 0 holds two samples, row 1 one."""
    q, k, v = qkv(2, 6)
    cu = cu_of([2, 4, 6])
    out, _ = varlen_attention_forward(Attn(4, 2), q, k, v, None, cu_seq_lens_q=cu)
    ref = reference(q, k, v, segment_ids([[2, 4], [6]]), causal=True)
    torch.testing.assert_close(out, ref)


def test_scaling_and_sliding_window() -> None:
    lengths = [3, 9]
    q, k, v = qkv(1, 12)
    cu = cu_of(lengths)
    out, _ = varlen_attention_forward(
        Attn(4, 2), q, k, v, None, scaling=0.5, sliding_window=4, cu_seq_lens_q=cu
    )
    ref = reference(q * (0.5 / 8**-0.5), k, v, segment_ids([lengths]), causal=True, window=4)
    torch.testing.assert_close(out, ref)
    # The window bites: without it the long segment's output differs.
    full, _ = varlen_attention_forward(Attn(4, 2), q, k, v, None, scaling=0.5, cu_seq_lens_q=cu)
    assert not torch.allclose(full, out)
    # A window without segments (one plain causal row) is applied too.
    row, _ = varlen_attention_forward(Attn(4, 2), q, k, v, None, sliding_window=4)
    torch.testing.assert_close(row, reference(q, k, v, segment_ids([[12]]), causal=True, window=4))


def test_positions_give_the_segments_without_cu_seq_lens() -> None:
    lengths = [5, 1, 9, 3]
    q, k, v = qkv(1, sum(lengths))
    positions = torch.cat([torch.arange(n) for n in lengths]).unsqueeze(0)
    out, _ = varlen_attention_forward(Attn(4, 2), q, k, v, None, position_ids=positions)
    torch.testing.assert_close(out, reference(q, k, v, segment_ids([lengths]), causal=True))


def test_without_segments_it_is_sdpa() -> None:
    q, k, v = qkv(2, 7)
    module = Attn(4, 2)
    expected, _ = sdpa_attention_forward(module, q, k, v, None)
    assert torch.equal(varlen_attention_forward(module, q, k, v, None)[0], expected)
    positions = torch.arange(7).expand(2, -1)  # not packed: one sequence per row
    got, _ = varlen_attention_forward(module, q, k, v, None, position_ids=positions)
    assert torch.equal(got, expected)
    # A real mask (padding) goes to SDPA with it, even with cu_seq_lens around.
    mask = torch.ones(2, 1, 7, 7, dtype=torch.bool).tril()
    mask[1, ..., 4:] = False
    expected, _ = sdpa_attention_forward(module, q, k, v, mask)
    got, _ = varlen_attention_forward(module, q, k, v, mask, cu_seq_lens_q=cu_of([3, 11]))
    assert torch.equal(got, expected)


def test_dropout_is_applied() -> None:
    lengths = [6, 6]
    q, k, v = qkv(1, 12)
    cu = cu_of(lengths)
    plain, _ = varlen_attention_forward(Attn(4, 2), q, k, v, None, cu_seq_lens_q=cu)
    torch.manual_seed(0)
    dropped, _ = varlen_attention_forward(Attn(4, 2), q, k, v, None, dropout=0.5, cu_seq_lens_q=cu)
    assert torch.isfinite(dropped).all() and not torch.allclose(dropped, plain)


def test_boundaries_must_cover_the_tokens() -> None:
    q, k, v = qkv(1, 10)
    with pytest.raises(ValueError, match=r"spans 0\.\.8"):
        varlen_attention_forward(Attn(4, 2), q, k, v, None, cu_seq_lens_q=cu_of([3, 5]))
    with pytest.raises(ValueError, match="segments"):
        varlen_attention_forward(
            Attn(4, 2), q, k, v, None, cu_seq_lens_q=cu_of([5, 5]), cu_seq_lens_k=cu_of([10])
        )


def test_mask_function_skips_the_mask_only_where_segments_do_its_work() -> None:
    args = {"batch_size": 1, "q_length": 6, "kv_length": 6}
    assert varlen_mask(**args) is None  # packed or plain causal: no (Σ L)² mask
    padding = torch.tensor([[True, True, True, True, False, False]])
    expected = sdpa_mask(**args, attention_mask=padding)
    assert expected is not None
    assert torch.equal(varlen_mask(**args, attention_mask=padding), expected)
    # With a cache (keys longer than queries) the mask is SDPA's too.
    decode = {"batch_size": 1, "q_length": 1, "kv_length": 6, "q_offset": 5}
    assert varlen_mask(**decode, allow_is_causal_skip=False) is not None


# -- wiring: runtime, config, lazy import -------------------------------------------------------


def feat(n: int, start: int = 1) -> SampleFeatures:
    ids = torch.arange(start, start + n)
    return SampleFeatures(input_ids=ids, labels=ids.clone())


def test_packed_runtime_adds_the_boundaries_only_when_asked() -> None:
    opts = {"micro_batch_size": 4, "max_seq_len": 64, "pad_token_id": 0}
    plain = PackedRuntime(BatchingOptions(**opts)).make_micro_batch([feat(3), feat(2)])
    assert not {"cu_seq_lens_q", "max_length_q"} & set(plain.model_inputs)
    rt = PackedRuntime(BatchingOptions(**opts, pad_to_multiple_of=8, varlen_kwargs=True))
    mb = rt.make_micro_batch([feat(3), feat(2)])
    x = mb.model_inputs
    assert x["cu_seq_lens_q"].tolist() == [0, 3, 5, 8]  # the padding segment too
    assert x["cu_seq_lens_q"].dtype == torch.int32 and x["cu_seq_lens_k"] is x["cu_seq_lens_q"]
    assert x["max_length_q"] == x["max_length_k"] == 3
    # One tensor on the device too, so the host copy of the boundaries is made once.
    moved, _ = rt.to_device(mb, torch.device("cpu"))
    assert moved["cu_seq_lens_k"] is moved["cu_seq_lens_q"]
    padded = PaddedRuntime(BatchingOptions(**opts, varlen_kwargs=True)).make_micro_batch(
        [feat(3), feat(2)]
    )
    assert "cu_seq_lens_q" not in padded.model_inputs


@pytest.mark.parametrize(
    ("impl", "expected"),
    [("varlen", True), ("flash_attention_2", True), ("sdpa", False), ("eager", False)],
)
def test_resolve_runtime_asks_for_boundaries_per_attention(impl: str, expected: bool) -> None:
    assert uses_varlen_kwargs(impl) is expected
    config = SimpleNamespace(
        data=SimpleNamespace(batching="packed", max_seq_len=64),
        training=SimpleNamespace(micro_batch_size=2),
        model=SimpleNamespace(attn_implementation=impl),
    )
    rt = resolve_runtime(
        config, HFCausalLMAdapter(), SimpleNamespace(pad_token_id=0), isolated_host().registries
    )
    assert rt.options.varlen_kwargs is expected


def test_importing_hyper_core_does_not_import_torch() -> None:
    code = (
        "import sys, hyper_core, hyper_core.attention, hyper_core.adapters.hf, "
        "hyper_core.resolve, hyper_core.batching.packed\n"
        "hyper_core.attention.uses_varlen_kwargs('varlen')\n"
        "assert 'torch' not in sys.modules and 'transformers' not in sys.modules"
    )
    root = Path(__file__).resolve().parents[2]
    subprocess.run([sys.executable, "-c", code], check=True, cwd=root)


# -- the tiny text models -----------------------------------------------------------------------


def text_samples() -> list[SampleFeatures]:
    g = torch.Generator().manual_seed(1)
    out = []
    for n in (5, 11, 3, 8):
        ids = torch.randint(1, 1000, (n,), generator=g)
        labels = torch.full((n,), IGNORE_INDEX)
        labels[: n - 1] = ids[1:]
        out.append(SampleFeatures(input_ids=ids, labels=labels))
    return out


class Spy:
    """Wraps the registered ``varlen`` function; records what each call received."""

    def __init__(self) -> None:
        self.calls: list[dict[str, Any]] = []

    def __call__(self, module: Any, query: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        self.calls.append({"cu": kwargs.get("cu_seq_lens_q"), "length": query.shape[2]})
        return varlen_attention_forward(module, query, *args, **kwargs)


@pytest.mark.parametrize("config", ["tiny-qwen2", "tiny-llama"])
def test_text_model_packed_varlen_equals_padded_and_packed_sdpa(
    config: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    adapter = HFCausalLMAdapter()
    torch.manual_seed(0)
    sdpa = adapter.build_model(ModelConfig(adapter="hf_causal_lm", config=config))
    varlen = adapter.build_model(
        ModelConfig(adapter="hf_causal_lm", config=config, attn_implementation=VARLEN)
    )
    varlen.load_state_dict(sdpa.state_dict())
    assert varlen.config._attn_implementation == VARLEN
    assert varlen.config.num_attention_heads > varlen.config.num_key_value_heads  # GQA
    feats = text_samples()
    spy = Spy()
    monkeypatch.setitem(AttentionInterface._global_mapping, VARLEN, spy)
    padded = loss_and_grads(sdpa, micro_batch(feats, "padded"))
    results = {
        "packed sdpa": loss_and_grads(sdpa, micro_batch(feats, "packed")),
        "packed varlen": loss_and_grads(varlen, micro_batch(feats, "packed", varlen_kwargs=True)),
        "packed varlen, boundaries from positions": loss_and_grads(
            varlen, micro_batch(feats, "packed")
        ),
        "padded varlen": loss_and_grads(varlen, micro_batch(feats, "padded")),
    }
    for name, (loss, grad) in results.items():
        assert loss == pytest.approx(padded[0], abs=1e-5), name
        assert grad.keys() == padded[1].keys()
        for key, g in grad.items():
            assert torch.allclose(g, padded[1][key], atol=1e-5, rtol=1e-4), (name, key)
    # The boundaries reached every layer's attention (forward only: 2 layers per forward).
    with_cu = [c for c in spy.calls if c["cu"] is not None]
    assert len(with_cu) == varlen.config.num_hidden_layers
    assert with_cu[0]["cu"].tolist() == [0, 5, 16, 19, 27]
    # Control: boundaries that merge the samples let them attend to each other.
    mb = micro_batch(feats, "packed", varlen_kwargs=True)
    mb.model_inputs["cu_seq_lens_q"] = mb.model_inputs["cu_seq_lens_k"] = cu_of([27])
    with torch.no_grad():
        leaky = loss_of(varlen, mb).item()
    assert abs(leaky - padded[0]) > 1e-4


def test_training_with_varlen_equals_sdpa(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Through the trainer (runtime options, device move, activation checkpointing)."""
    spy = Spy()
    monkeypatch.setitem(AttentionInterface._global_mapping, VARLEN, spy)
    runs = {
        impl: run_tiny_training(
            tiny_text_config(
                tmp_path / impl,
                model={"attn_implementation": impl},
                training={"activation_checkpointing": True},
            ),
            steps=3,
        )
        for impl in ("sdpa", VARLEN)
    }
    assert runs[VARLEN].trainer.runtime.options.varlen_kwargs is True
    assert runs["sdpa"].trainer.runtime.options.varlen_kwargs is False
    assert runs[VARLEN].losses == pytest.approx(runs["sdpa"].losses, abs=1e-5)
    assert spy.calls and all(c["cu"] is not None for c in spy.calls)
    assert max(len(c["cu"]) for c in spy.calls) > 2  # packed rows of several samples
