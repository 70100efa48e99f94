"""``varlen`` attention on the four model types: packed varlen = padded = packed sdpa."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from qwen_vl_helpers import model_config
from transformers import AttentionInterface

from hyper_core.adapters.base import ModelAssets
from hyper_core.attention import VARLEN
from hyper_core.attention.varlen import varlen_attention_forward
from hyper_core.testing.vl import assert_same_loss_and_grads, loss_and_grads, loss_of, micro_batch
from hyper_qwen_vl.adapters import QwenVLAdapter


def test_packed_varlen_equals_padded(
    family: str,
    adapter: QwenVLAdapter,
    assets: ModelAssets,
    tiny_model: torch.nn.Module,
    samples: list[dict[str, Any]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    feats = [adapter.transform(s, assets, max_seq_len=1024) for s in samples]
    assert [f.num_images for f in feats] == [0, 1, 2]
    varlen = adapter.build_model(model_config(family, attn_implementation=VARLEN))
    varlen.load_state_dict(tiny_model.state_dict())
    assert varlen.config.vision_config._attn_implementation == VARLEN
    calls: list[dict[str, Any]] = []

    def spy(module: Any, query: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        calls.append({"cu": kwargs.get("cu_seq_lens_q"), "causal": kwargs.get("is_causal")})
        return varlen_attention_forward(module, query, *args, **kwargs)

    monkeypatch.setitem(AttentionInterface._global_mapping, VARLEN, spy)
    padded = loss_and_grads(tiny_model, micro_batch(feats, "padded"))
    packed_mb = micro_batch(feats, "packed", varlen_kwargs=True)
    results = {
        "packed sdpa": loss_and_grads(tiny_model, micro_batch(feats, "packed")),
        "packed varlen": loss_and_grads(varlen, packed_mb),
        "padded varlen": loss_and_grads(varlen, micro_batch(feats, "padded")),
    }
    assert_same_loss_and_grads(results, padded)
    assert any(
        ".visual.blocks." in k and g.abs().sum() > 0 for k, g in results["packed varlen"][1].items()
    )
    # The text layers got the row's boundaries; the vision tower (is_causal=False, one call per
    # image or window) ran through varlen too but never saw the text boundaries.
    text = [c for c in calls if c["cu"] is not None]
    vision = [c for c in calls if c["causal"] is False]
    assert len(text) == varlen.config.text_config.num_hidden_layers
    assert text[0]["cu"].tolist() == [0, *torch.tensor(packed_mb.sample_lengths).cumsum(0).tolist()]
    assert vision and all(c["cu"] is None for c in vision)
    # Control: one segment over the whole row lets the samples attend to each other.
    leaky_mb = micro_batch(feats, "packed", varlen_kwargs=True)
    whole = torch.tensor([0, leaky_mb.num_tokens], dtype=torch.int32)
    leaky_mb.model_inputs["cu_seq_lens_q"] = leaky_mb.model_inputs["cu_seq_lens_k"] = whole
    with torch.no_grad():
        leaky = loss_of(varlen, leaky_mb).item()
    assert abs(leaky - padded[0]) > 1e-4
