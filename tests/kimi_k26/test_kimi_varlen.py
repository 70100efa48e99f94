"""``varlen`` attention on the tiny Kimi-K2.5: packed varlen = padded, text boundaries kept from
the vision tower."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from kimi_helpers import model_config

from hyper_core.adapters.base import ModelAssets
from hyper_core.attention import VARLEN
from hyper_core.testing.vl import assert_same_loss_and_grads, loss_and_grads, loss_of, micro_batch
from hyper_kimi_k26.adapter import KimiK25Adapter


def test_packed_varlen_equals_padded(
    adapter: KimiK25Adapter,
    assets: ModelAssets,
    tiny_model: torch.nn.Module,
    samples: list[dict[str, Any]],
) -> None:
    feats = [adapter.transform(s, assets, max_seq_len=1024) for s in samples]
    assert [f.num_images for f in feats] == [0, 1, 2]
    varlen = adapter.build_model(model_config(attn_implementation=VARLEN))
    varlen.load_state_dict(tiny_model.state_dict())
    padded = loss_and_grads(tiny_model, micro_batch(feats, "padded"))
    results = {
        "packed sdpa": loss_and_grads(tiny_model, micro_batch(feats, "packed")),
        "packed varlen": loss_and_grads(varlen, micro_batch(feats, "packed", varlen_kwargs=True)),
        "padded varlen": loss_and_grads(varlen, micro_batch(feats, "padded")),
    }
    assert_same_loss_and_grads(results, padded)
    assert any("vision_tower" in k for k in results["packed varlen"][1])
    # Control: the model's forward hands every kwarg to its vision tower; without the adapter's
    # hook the text boundaries reach the per-image attention, which refuses them.
    varlen.model.vision_tower._forward_pre_hooks.clear()
    with pytest.raises(ValueError, match="cu_seq_lens_q spans"), torch.no_grad():
        loss_of(varlen, micro_batch(feats, "packed", varlen_kwargs=True))
