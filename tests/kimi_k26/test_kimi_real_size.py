"""The real-size recipe (configs/kimi_k26.toml) builds on the meta device with the published
parameter counts: ≈1.0 T total, ≈32 B active."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from hyper_core.adapters.hf import match_modules
from hyper_core.config import load_config
from hyper_core.testing import isolated_host
from hyper_kimi_k26.adapter import KimiK25Adapter

REPO = Path(__file__).resolve().parents[2]


def formula_counts(cfg: Any) -> dict[str, float]:
    """Parameter counts from the config's sizes alone (independent of the modeling code)."""
    t, v = cfg.text_config, cfg.vision_config
    h = t.hidden_size
    qk = t.qk_nope_head_dim + t.qk_rope_head_dim
    attn = (
        h * t.q_lora_rank
        + t.q_lora_rank  # q_a_proj + q_a_layernorm
        + t.q_lora_rank * t.num_attention_heads * qk  # q_b_proj
        + h * (t.kv_lora_rank + t.qk_rope_head_dim)
        + t.kv_lora_rank  # kv_a + its norm
        + t.kv_lora_rank * t.num_attention_heads * (t.qk_nope_head_dim + t.v_head_dim)
        + t.num_attention_heads * t.v_head_dim * h  # o_proj
    )
    expert = 3 * h * t.moe_intermediate_size
    moe_layers = t.num_hidden_layers - t.first_k_dense_replace
    routed = moe_layers * t.n_routed_experts * expert
    text = (
        2 * t.vocab_size * h  # embeddings + untied lm_head
        + t.num_hidden_layers * (attn + 2 * h)
        + t.first_k_dense_replace * 3 * h * t.intermediate_size
        + routed
        + moe_layers * (t.n_shared_experts * expert + t.n_routed_experts * h)  # shared + gate
        + h
    )
    d, m = v.hidden_size, v.intermediate_size
    block = 4 * (d * d + d) + 2 * d * m + m + d + 4 * d
    vision = (
        v.num_hidden_layers * block
        + 3 * v.patch_size**2 * d
        + d
        + v.pos_emb_height * v.pos_emb_width * d
        + 2 * d
    )
    merged = d * v.merge_kernel_size[0] * v.merge_kernel_size[1]
    projector = 2 * d + merged * merged + merged + merged * h + h
    total = text + vision + projector
    active = total - routed * (1 - t.num_experts_per_tok / t.n_routed_experts)
    return {"total": total, "active": active, "text": text, "vision": vision}


@pytest.fixture(scope="module")
def real_model(tmp_path_factory: pytest.TempPathFactory) -> torch.nn.Module:
    """configs/kimi_k26.toml with [model] path at a directory holding the published config."""
    from hyper_core.config.schema import ModelConfig

    path = tmp_path_factory.mktemp("kimi-k2.6")
    adapter = KimiK25Adapter()
    adapter.hf_config(ModelConfig(adapter="kimi_k26", config="kimi-k2.6")).save_pretrained(
        str(path)
    )
    host = isolated_host(["hyper_kimi_k26.plugin"])
    cfg = load_config(
        REPO / "configs" / "kimi_k26.toml",
        [f"--model.path={path}"],
        sections=host.registries.config_sections,
    )
    assert cfg.model.freeze == ["vision"] and cfg.parallel.strategy == "fsdp2"
    assert cfg.model.trust_remote_code is False
    return adapter.build_model(cfg.model, device="meta")


def test_architecture(real_model: torch.nn.Module) -> None:
    cfg = real_model.config
    t, v = cfg.text_config, cfg.vision_config
    assert (t.hidden_size, t.num_hidden_layers, t.num_attention_heads) == (7168, 61, 64)
    assert (t.intermediate_size, t.moe_intermediate_size) == (18432, 2048)
    assert (t.n_routed_experts, t.n_shared_experts, t.num_experts_per_tok) == (384, 1, 8)
    assert t.first_k_dense_replace == 1 and t.vocab_size == 163840
    assert (t.q_lora_rank, t.kv_lora_rank) == (1536, 512)
    assert (t.qk_nope_head_dim, t.qk_rope_head_dim, t.v_head_dim) == (128, 64, 128)
    assert (v.patch_size, v.num_hidden_layers, v.hidden_size) == (14, 27, 1152)
    assert (v.intermediate_size, v.num_attention_heads, v.hidden_act) == (
        4304,
        16,
        "gelu_pytorch_tanh",
    )
    assert list(v.merge_kernel_size) == [2, 2] and (v.pos_emb_height, v.pos_emb_width) == (64, 64)
    assert cfg.image_token_id == 163605
    assert real_model.model.mm_projector.out_proj.weight.shape == (7168, 4608)
    assert {p.device.type for p in real_model.parameters()} == {"meta"}
    layers = match_modules(real_model, ("model.language_model.layers.*",))
    assert len(layers) == 61


def test_parameter_counts(real_model: torch.nn.Module) -> None:
    adapter = KimiK25Adapter()
    measured = adapter.param_counts(real_model)
    expected = formula_counts(real_model.config)
    print(
        f"\nKimi-K2.6 on meta: total {measured['total'] / 1e9:.2f} B, "
        f"active {measured['active'] / 1e9:.2f} B "
        f"(formula: {expected['total'] / 1e9:.2f} B / {expected['active'] / 1e9:.2f} B)"
    )
    assert measured["total"] == pytest.approx(expected["total"], rel=0.02)
    assert measured["active"] == pytest.approx(expected["active"], rel=0.02)
    assert 0.98e12 < measured["total"] < 1.06e12  # "1 T total"
    assert 31e9 < measured["active"] < 35e9  # "32 B active"
    json.dumps(measured)  # plain ints


def test_freeze_and_plan_on_real_size(real_model: torch.nn.Module) -> None:
    adapter = KimiK25Adapter()
    plan = adapter.parallel_plan(real_model)
    units = match_modules(real_model, plan.sharding_units)
    assert len(units) == 61 + 27
    vision = sum(p.numel() for p in real_model.model.vision_tower.parameters())
    assert 0.40e9 < vision < 0.43e9
