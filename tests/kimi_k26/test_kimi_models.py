"""The tiny model: build, train step, packed = unpacked, freezing, parallel plan, FLOPs, router
statistics, quantized checkpoints."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from kimi_helpers import model_config

from hyper_core.adapters.base import ModelAssets
from hyper_core.adapters.hf import count_params, match_modules
from hyper_core.adapters.vision_context import VisionContext
from hyper_core.builtin.stages import freeze
from hyper_core.errors import UserError
from hyper_core.testing.vl import loss_of, micro_batch
from hyper_kimi_k26.adapter import KimiK25Adapter


def features(adapter: KimiK25Adapter, assets: ModelAssets, samples: list[dict[str, Any]]) -> list:
    return [adapter.transform(s, assets, max_seq_len=1024) for s in samples]


def test_builds_on_cpu_and_meta(adapter: KimiK25Adapter) -> None:
    cpu = adapter.build_model(model_config())
    meta = adapter.build_model(model_config(), device="meta")
    assert type(cpu).__name__ == type(meta).__name__ == "Kimi_K25ForConditionalGeneration"
    assert {p.device.type for p in cpu.parameters()} == {"cpu"}
    assert {p.device.type for p in meta.parameters()} == {"meta"}
    assert {n: p.shape for n, p in cpu.named_parameters()} == {
        n: p.shape for n, p in meta.named_parameters()
    }
    assert 200_000 < sum(p.numel() for p in cpu.parameters()) < 260_000
    text = cpu.config.text_config
    assert type(cpu.model.language_model).__name__ == "DeepseekV3Model"
    assert (text.n_routed_experts, text.num_experts_per_tok, text.n_shared_experts) == (4, 2, 1)
    assert type(cpu.model.language_model.layers[0].mlp).__name__ == "DeepseekV3MLP"  # dense
    assert type(cpu.model.language_model.layers[1].mlp).__name__ == "DeepseekV3MoE"
    assert cpu.lm_head.weight is not cpu.model.language_model.embed_tokens.weight  # untied
    assert cpu.config.vision_config.patch_size == 14
    assert list(cpu.config.vision_config.merge_kernel_size) == [2, 2]


def test_train_step(
    adapter: KimiK25Adapter,
    assets: ModelAssets,
    tiny_model: torch.nn.Module,
    samples: list[dict[str, Any]],
) -> None:
    mb = micro_batch(features(adapter, assets, samples), "packed")
    assert mb.model_inputs["position_ids"].shape == (1, mb.num_tokens)
    assert mb.model_inputs["pixel_values"].shape[1:] == (3, 14, 14)
    before = {n: p.detach().clone() for n, p in tiny_model.named_parameters()}
    opt = torch.optim.AdamW(tiny_model.parameters(), lr=1e-3)
    loss = loss_of(tiny_model, mb)
    assert torch.isfinite(loss) and 4.0 < loss.item() < 9.0  # ~ln(512) at random init
    loss.backward()
    opt.step()
    changed = {n for n, p in tiny_model.named_parameters() if not torch.equal(p, before[n])}
    assert any(".vision_tower.layers." in n for n in changed)  # the pixels reach the loss
    assert any(".mm_projector." in n for n in changed)
    assert any(".mlp.experts." in n for n in changed)
    assert any(".mlp.shared_experts." in n for n in changed)
    second = loss_of(tiny_model, mb)
    assert torch.isfinite(second) and second.item() < loss.item()


def _loss_and_grads(
    model: torch.nn.Module, batches: list, total_loss_tokens: float
) -> tuple[float, dict[str, torch.Tensor]]:
    model.zero_grad(set_to_none=True)
    total = 0.0
    for mb in batches:
        loss = loss_of(model, mb, total_loss_tokens)
        loss.backward()
        total += loss.item()
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
    return total, grads


def test_packed_equals_unpacked(
    adapter: KimiK25Adapter,
    assets: ModelAssets,
    tiny_model: torch.nn.Module,
    samples: list[dict[str, Any]],
) -> None:
    """One packed row = the padded batch = each sample alone (loss and every gradient)."""
    feats = features(adapter, assets, samples)
    assert [f.num_images for f in feats] == [0, 1, 2]
    n_loss = float(sum(f.num_loss_tokens for f in feats))
    packed = _loss_and_grads(tiny_model, [micro_batch(feats, "packed")], n_loss)
    padded = _loss_and_grads(tiny_model, [micro_batch(feats, "padded")], n_loss)
    alone = _loss_and_grads(tiny_model, [micro_batch([f], "packed") for f in feats], n_loss)
    for name, (loss, grads) in {"padded": padded, "alone": alone}.items():
        assert packed[0] == pytest.approx(loss, abs=1e-5), name
        assert packed[1].keys() == grads.keys(), name
        for key, grad in packed[1].items():
            assert torch.allclose(grad, grads[key], atol=1e-5, rtol=1e-4), (name, key)
    assert any("vision_tower" in k for k in packed[1])
    # Control: with the config's use_cache=True transformers builds a cache, skips the packed
    # sample detection and lets samples attend to each other: the loss silently changes.
    with torch.no_grad():
        mb = micro_batch(feats, "packed")
        outputs = tiny_model(**mb.model_inputs)
    from hyper_core.step.loss import causal_lm_loss

    leaky, _ = causal_lm_loss(outputs, mb.loss_inputs, n_loss)
    assert abs(leaky.item() - packed[0]) > 1e-4


def test_freeze_groups(adapter: KimiK25Adapter, tiny_model: torch.nn.Module) -> None:
    groups = adapter.freeze_groups(tiny_model)
    assert groups == {
        "vision": ["model.vision_tower"],
        "projector": ["model.mm_projector"],
        "language": ["model.language_model", "lm_head"],
    }
    owner: dict[str, str] = {}
    for group, paths in groups.items():
        for path in paths:
            for name, _ in tiny_model.get_submodule(path).named_parameters(prefix=path):
                assert owner.setdefault(name, group) == group, name
    assert set(owner) == {n for n, _ in tiny_model.named_parameters()}

    freeze(tiny_model, adapter, ["vision"])  # what [model] freeze = ["vision"] does
    frozen = {n for n, p in tiny_model.named_parameters() if not p.requires_grad}
    assert frozen == {n for n, g in owner.items() if g == "vision"}
    trainable = {n for n, p in tiny_model.named_parameters() if p.requires_grad}
    assert any(n.startswith("model.mm_projector.") for n in trainable)
    assert "lm_head.weight" in trainable


def test_parallel_plan(adapter: KimiK25Adapter, tiny_model: torch.nn.Module) -> None:
    plan = adapter.parallel_plan(tiny_model)
    units = match_modules(tiny_model, plan.sharding_units)
    assert units == [
        "model.vision_tower.layers.0",
        "model.vision_tower.layers.1",
        "model.language_model.layers.0",
        "model.language_model.layers.1",
    ]
    assert type(tiny_model.get_submodule(units[0])).__name__ == "Kimi_K25VisionEncoderLayer"
    assert type(tiny_model.get_submodule(units[-1])).__name__ == "DeepseekV3DecoderLayer"
    assert plan.vision_encoder is not None
    assert plan.vision_encoder.module == "model.vision_tower"
    assert plan.vision_encoder.input_keys == ("pixel_values", "image_grid_thw")


def test_vision_encoder_per_image(
    adapter: KimiK25Adapter,
    assets: ModelAssets,
    tiny_model: torch.nn.Module,
    samples: list[dict[str, Any]],
) -> None:
    mb = micro_batch(features(adapter, assets, samples), "packed")
    context = VisionContext.of(mb, tiny_model.config)
    parts = adapter.split_vision_inputs(mb.model_inputs, context)
    assert len(parts) == 3
    grid = mb.model_inputs["image_grid_thw"]
    assert [p["pixel_values"].shape[0] for p in parts] == grid.prod(-1).tolist()
    tiny_model.eval()
    with torch.no_grad():
        whole = adapter.call_vision_encoder(tiny_model, mb.model_inputs, context)
        single = [
            adapter.call_vision_encoder(tiny_model, p, context.take([i])).pooler_output[0]
            for i, p in enumerate(parts)
        ]
        # the forward takes the encoder output in place of pixels
        inputs = {
            k: v for k, v in mb.model_inputs.items() if k not in ("pixel_values", "image_grid_thw")
        }
        via = tiny_model(**inputs, mm_encoder_outputs={"image": whole}, use_cache=False).logits
        direct = tiny_model(**mb.model_inputs, use_cache=False).logits
    assert [a.shape[0] for a in whole.pooler_output] == [12, 16, 12]
    for a, b in zip(whole.pooler_output, single):
        assert a.shape == (b.shape[0], tiny_model.config.text_config.hidden_size)
        assert torch.allclose(a, b, atol=1e-5)
    assert torch.allclose(via, direct, atol=1e-5)
    assert adapter.split_vision_inputs({"input_ids": mb.model_inputs["input_ids"]}, context) == []


def test_flops_count_active_params(
    adapter: KimiK25Adapter,
    assets: ModelAssets,
    tiny_model: torch.nn.Module,
    samples: list[dict[str, Any]],
) -> None:
    feats = features(adapter, assets, samples)
    text_only = adapter.flops(tiny_model, micro_batch(feats[:1], "packed"))
    assert text_only.vision == 0 and text_only.text > 0
    one = adapter.flops(tiny_model, micro_batch(feats[:2], "packed"))
    mb = micro_batch(feats, "packed")
    both = adapter.flops(tiny_model, mb)
    assert 0 < one.vision < both.vision
    lm = tiny_model.model.language_model
    experts = count_params(lm.layers[1].mlp.experts)
    active = count_params(lm) + tiny_model.lm_head.weight.numel() - experts // 2  # top-2 of 4
    cfg = tiny_model.config.text_config
    attention = 3.0 * 2 * 4 * (16 + 8 + 16) * sum(n * n for n in mb.sample_lengths)
    assert cfg.num_hidden_layers == 2 and cfg.num_attention_heads == 4
    assert both.text == pytest.approx(6 * active * mb.num_tokens + attention)
    counts = adapter.param_counts(tiny_model)
    assert counts["active"] == counts["total"] - experts // 2


def test_router_stats(
    adapter: KimiK25Adapter,
    assets: ModelAssets,
    tiny_model: torch.nn.Module,
    samples: list[dict[str, Any]],
) -> None:
    from hyper_kimi_k26.moe import RouterStats

    mb = micro_batch(features(adapter, assets, samples), "packed")
    stats = RouterStats(tiny_model)
    assert stats.collect() == {}
    assert [n for n, _ in stats.routers] == ["model.language_model.layers.1.mlp.gate"]
    tiny_model.train()
    loss_of(tiny_model, mb).backward()
    assert float(stats._counts[0].sum()) == mb.num_tokens * 2  # every token picks 2 experts
    metrics = stats.collect()
    assert set(metrics) == {
        "moe/load_max",
        "moe/load_min",
        "moe/load_cv",
        "moe/balance",
        "moe/dead_experts",
    }
    assert metrics["moe/load_max"] >= 1.0 >= metrics["moe/load_min"] >= 0.0
    assert 0.0 < metrics["moe/balance"] < 4.0
    assert stats.collect() == {}  # reset after collecting
    tiny_model.eval()
    with torch.no_grad():
        tiny_model(**mb.model_inputs, use_cache=False)
    assert stats.collect() == {}  # evaluation is not counted
    stats.remove()  # the run's object removes its hooks when the run ends
    tiny_model.train()
    with torch.no_grad():
        tiny_model(**mb.model_inputs, use_cache=False)
    assert stats.collect() == {}


def _save_config(adapter: KimiK25Adapter, path: Path, **changes: Any) -> None:
    adapter.hf_config(model_config()).save_pretrained(str(path))
    raw = json.loads((path / "config.json").read_text())
    raw.update(changes)
    (path / "config.json").write_text(json.dumps(raw))


def test_quantized_checkpoint_is_a_user_error(adapter: KimiK25Adapter, tmp_path: Path) -> None:
    quant = {
        "quant_method": "compressed-tensors",
        "format": "pack-quantized",
        "config_groups": {
            "group_0": {"targets": ["Linear"], "weights": {"num_bits": 4, "group_size": 32}}
        },
    }
    _save_config(adapter, tmp_path, quantization_config=quant)
    (tmp_path / "model.safetensors").write_bytes(b"")
    with pytest.raises(UserError) as info:
        adapter.build_model(model_config(path=str(tmp_path)))
    message = str(info.value)
    assert str(tmp_path) in message and "compressed-tensors" in message
    assert "INT4" in message and "group size 32" in message and "BF16" in message
    # also when the quantization config sits in text_config, and for a meta build
    raw = json.loads((tmp_path / "config.json").read_text())
    raw["text_config"]["quantization_config"] = raw.pop("quantization_config")
    (tmp_path / "config.json").write_text(json.dumps(raw))
    with pytest.raises(UserError, match="dequantized to BF16"):
        adapter.build_model(model_config(path=str(tmp_path)), device="meta")


def test_tie_word_embeddings_from_text_config(adapter: KimiK25Adapter, tmp_path: Path) -> None:
    """A config.json stating tie_word_embeddings only in text_config (false) must not get the
    native class's top-level default (true), which would tie lm_head to the embeddings."""
    _save_config(adapter, tmp_path)
    raw = json.loads((tmp_path / "config.json").read_text())
    del raw["tie_word_embeddings"]
    (tmp_path / "config.json").write_text(json.dumps(raw))
    model = adapter.build_model(model_config(path=str(tmp_path)), device="meta")
    assert model.config.tie_word_embeddings is False
    assert model.lm_head.weight is not model.model.language_model.embed_tokens.weight


def test_router_stats_count_a_checkpointed_forward_once_without_bincount(
    adapter: KimiK25Adapter,
    assets: ModelAssets,
    samples: list[dict[str, Any]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Activation checkpointing recomputes the forward in backward: counted once. And no
    ``bincount`` (its output size makes a CUDA step wait on the host)."""
    from hyper_kimi_k26.moe import RouterStats

    def no_bincount(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("bincount syncs on CUDA")

    monkeypatch.setattr(torch, "bincount", no_bincount)
    torch.manual_seed(0)
    model = adapter.build_model(model_config())
    model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
    mb = micro_batch(features(adapter, assets, samples), "packed")
    stats = RouterStats(model)
    model.train()
    loss_of(model, mb).backward()
    assert float(stats._counts[0].sum()) == mb.num_tokens * 2
