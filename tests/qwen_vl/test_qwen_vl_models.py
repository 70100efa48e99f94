"""The four model types: build, train, packed = padded, freezing, parallel plan, FLOPs, mRoPE."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from qwen_vl_helpers import loss_of, model_config

from hyper_core.adapters.base import ModelAssets
from hyper_core.adapters.hf import count_params, match_modules
from hyper_core.adapters.vision_context import VisionContext
from hyper_core.builtin.stages import freeze
from hyper_core.testing.vl import micro_batch
from hyper_qwen_vl.adapters import QwenVLAdapter
from hyper_qwen_vl.rope import mrope_position_ids
from hyper_qwen_vl.tokens import OFFLINE_IDS

MODEL_CLASSES = {
    "qwen2_vl": "Qwen2VLForConditionalGeneration",
    "qwen2_5_vl": "Qwen2_5_VLForConditionalGeneration",
    "qwen3_vl": "Qwen3VLForConditionalGeneration",
    "qwen3_vl_moe": "Qwen3VLMoeForConditionalGeneration",
}


def features(adapter: QwenVLAdapter, assets: ModelAssets, samples: list[dict[str, Any]]) -> list:
    return [adapter.transform(s, assets, max_seq_len=1024) for s in samples]


def test_builds_on_cpu_and_meta(family: str, adapter: QwenVLAdapter) -> None:
    cpu = adapter.build_model(model_config(family))
    meta = adapter.build_model(model_config(family), device="meta")
    assert type(cpu).__name__ == type(meta).__name__ == MODEL_CLASSES[family]
    assert {p.device.type for p in cpu.parameters()} == {"cpu"}
    assert {p.device.type for p in meta.parameters()} == {"meta"}
    shapes = {n: p.shape for n, p in cpu.named_parameters()}
    assert shapes == {n: p.shape for n, p in meta.named_parameters()}
    n_params = sum(p.numel() for p in cpu.parameters())
    assert 150_000 < n_params < 260_000  # the demo's tiny shape
    cfg = cpu.config
    assert cfg.text_config.hidden_size == 64 and cfg.text_config.num_hidden_layers == 2
    assert cfg.vision_config.depth == 2
    assert cfg.vision_config.patch_size == (16 if family.startswith("qwen3") else 14)
    assert cfg.vision_config.spatial_merge_size == 2
    assert cfg.image_token_id == OFFLINE_IDS["<|image_pad|>"]
    assert cfg.vision_start_token_id == OFFLINE_IDS["<|vision_start|>"]
    assert cfg.vision_end_token_id == OFFLINE_IDS["<|vision_end|>"]
    if family == "qwen3_vl_moe":
        assert (cfg.text_config.num_experts, cfg.text_config.num_experts_per_tok) == (4, 2)


def test_tokenizer_matches_config(family: str, adapter: QwenVLAdapter, assets: ModelAssets) -> None:
    cfg = adapter.hf_config(model_config(family))
    vocab = assets.tokenizer.get_vocab()
    assert len(assets.tokenizer) <= cfg.text_config.vocab_size
    for field, token in {
        "image_token_id": "<|image_pad|>",
        "video_token_id": "<|video_pad|>",
        "vision_start_token_id": "<|vision_start|>",
        "vision_end_token_id": "<|vision_end|>",
    }.items():
        assert getattr(cfg, field) == vocab[token]
    assert assets.pad_token_id == vocab["<|endoftext|>"]
    assert cfg.text_config.eos_token_id == vocab["<|im_end|>"]


def test_train_step(
    family: str,
    adapter: QwenVLAdapter,
    assets: ModelAssets,
    tiny_model: torch.nn.Module,
    samples: list[dict[str, Any]],
) -> None:
    mb = micro_batch(features(adapter, assets, samples), "packed")
    assert mb.model_inputs["position_ids"].shape == (4, 1, mb.num_tokens)
    before = {n: p.detach().clone() for n, p in tiny_model.named_parameters()}
    opt = torch.optim.AdamW(tiny_model.parameters(), lr=1e-3)
    loss = loss_of(tiny_model, mb, adapter.forward_kwargs())
    assert torch.isfinite(loss) and 3.0 < loss.item() < 10.0  # ~ln(512) at random init
    loss.backward()
    opt.step()
    changed = [n for n, p in tiny_model.named_parameters() if not torch.equal(p, before[n])]
    assert "model.language_model.embed_tokens.weight" in changed  # tied with lm_head
    assert any(".visual.blocks." in n for n in changed)  # the pixels reach the loss
    second = loss_of(tiny_model, mb, adapter.forward_kwargs())
    assert torch.isfinite(second) and second.item() < loss.item()


def test_forward_kwargs_disable_cache(adapter: QwenVLAdapter) -> None:
    assert adapter.forward_kwargs() == {"use_cache": False}


def test_packed_equals_padded(
    family: str,
    adapter: QwenVLAdapter,
    assets: ModelAssets,
    tiny_model: torch.nn.Module,
    samples: list[dict[str, Any]],
) -> None:
    feats = features(adapter, assets, samples)
    assert [f.num_images for f in feats] == [0, 1, 2]
    kwargs = adapter.forward_kwargs()
    results = {}
    for kind in ("packed", "padded"):
        tiny_model.zero_grad(set_to_none=True)
        mb = micro_batch(feats, kind)
        loss = loss_of(tiny_model, mb, kwargs)
        loss.backward()
        grads = {n: p.grad.detach().clone() for n, p in tiny_model.named_parameters()}
        results[kind] = (loss.detach(), grads)
    (packed_loss, packed_grads), (padded_loss, padded_grads) = results["packed"], results["padded"]
    assert packed_loss.item() == pytest.approx(padded_loss.item(), abs=1e-5)
    assert packed_grads.keys() == padded_grads.keys()
    for name, grad in packed_grads.items():
        assert torch.allclose(grad, padded_grads[name], atol=1e-5, rtol=1e-4), name
    # Control: with the config's use_cache=True transformers builds a cache, skips the packed
    # sample detection and lets samples attend to each other: the loss silently changes.
    with torch.no_grad():
        leaky = loss_of(tiny_model, micro_batch(feats, "packed"), {})
    assert abs(leaky.item() - padded_loss.item()) > 1e-4


def test_freeze_groups(family: str, adapter: QwenVLAdapter, tiny_model: torch.nn.Module) -> None:
    groups = adapter.freeze_groups(tiny_model)
    assert set(groups) == {"vision", "projector", "language"}
    for paths in groups.values():
        for path in paths:
            tiny_model.get_submodule(path)  # exists
    assert "model.visual.blocks" in groups["vision"]
    assert "model.visual.patch_embed" in groups["vision"]
    assert "model.visual.merger" in groups["projector"]
    if family.startswith("qwen3"):
        assert "model.visual.deepstack_merger_list" in groups["projector"]
        assert "model.visual.pos_embed" in groups["vision"]
    # Every parameter belongs to exactly one group.
    owner: dict[str, str] = {}
    for group, paths in groups.items():
        for path in paths:
            for name, _ in tiny_model.get_submodule(path).named_parameters(
                prefix=path, remove_duplicate=False
            ):
                assert owner.setdefault(name, group) == group, name
    assert set(owner) >= {n for n, _ in tiny_model.named_parameters()}

    freeze(tiny_model, adapter, ["vision"])
    trainable = {n for n, p in tiny_model.named_parameters() if p.requires_grad}
    frozen = {n for n, p in tiny_model.named_parameters() if not p.requires_grad}
    assert frozen == {n for n, g in owner.items() if g == "vision"} & set(
        n for n, _ in tiny_model.named_parameters()
    )
    assert trainable and all(owner[n] != "vision" for n in trainable)
    assert any(n.startswith("model.visual.merger") for n in trainable)
    assert "model.language_model.embed_tokens.weight" in trainable


def test_freeze_projector_and_language(family: str, adapter: QwenVLAdapter) -> None:
    model = adapter.build_model(model_config(family))
    freeze(model, adapter, ["projector", "language"])
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trainable
    assert all(n.startswith("model.visual.") for n in trainable)
    projector = ("model.visual.merger", "model.visual.deepstack")
    assert not any(n.startswith(projector) for n in trainable)


def test_parallel_plan(family: str, adapter: QwenVLAdapter, tiny_model: torch.nn.Module) -> None:
    plan = adapter.parallel_plan(tiny_model)
    cfg = tiny_model.config
    units = match_modules(tiny_model, plan.sharding_units)
    layers = [u for u in units if u.startswith("model.language_model.layers.")]
    blocks = [u for u in units if u.startswith("model.visual.blocks.")]
    assert len(layers) == cfg.text_config.num_hidden_layers
    assert len(blocks) == cfg.vision_config.depth
    assert len(units) == len(layers) + len(blocks)
    assert type(tiny_model.get_submodule(layers[0])).__name__.endswith("DecoderLayer")
    assert plan.vision_encoder is not None
    assert plan.vision_encoder.module == "model.visual"
    tiny_model.get_submodule(plan.vision_encoder.module)
    assert plan.vision_encoder.input_keys == ("pixel_values", "image_grid_thw")


def test_vision_encoder_per_image(
    family: str,
    adapter: QwenVLAdapter,
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
    rejoined = torch.cat([p["pixel_values"] for p in parts])
    assert torch.equal(rejoined, mb.model_inputs["pixel_values"])
    tiny_model.eval()
    with torch.no_grad():
        whole = adapter.call_vision_encoder(tiny_model, mb.model_inputs, context).pooler_output
        single = [
            adapter.call_vision_encoder(tiny_model, p, context.take([i])).pooler_output[0]
            for i, p in enumerate(parts)
        ]
    assert len(whole) == 3
    for a, b in zip(whole, single):
        assert a.shape == (b.shape[0], tiny_model.config.text_config.hidden_size)
        assert torch.allclose(a, b, atol=1e-5)
    assert adapter.split_vision_inputs({"input_ids": mb.model_inputs["input_ids"]}, context) == []


def test_patch_embedding_is_a_matmul_equal_to_the_conv(
    family: str,
    adapter: QwenVLAdapter,
    assets: ModelAssets,
    tiny_model: torch.nn.Module,
    samples: list[dict[str, Any]],
) -> None:
    """The adapter's model multiplies patches as a matmul; transformers' Conv3d agrees."""
    from hyper_core.adapters.patch_conv import PatchwiseConv3d

    proj = tiny_model.get_submodule("model.visual.patch_embed.proj")
    assert type(proj) is PatchwiseConv3d
    mb = micro_batch(features(adapter, assets, samples), "packed")
    pixels = mb.model_inputs["pixel_values"]
    plain = torch.nn.Conv3d(
        proj.in_channels,
        proj.out_channels,
        proj.kernel_size,
        stride=proj.stride,
        bias=proj.bias is not None,
    )
    plain.load_state_dict(proj.state_dict())
    shaped = pixels.view(-1, proj.in_channels, *proj.kernel_size)
    torch.testing.assert_close(proj(shaped), plain(shaped), rtol=1e-5, atol=1e-5)


def test_flops(
    family: str,
    adapter: QwenVLAdapter,
    assets: ModelAssets,
    tiny_model: torch.nn.Module,
    samples: list[dict[str, Any]],
) -> None:
    feats = features(adapter, assets, samples)
    text_only = adapter.flops(tiny_model, micro_batch(feats[:1], "packed"))
    assert text_only.vision == 0 and text_only.text > 0
    one = adapter.flops(tiny_model, micro_batch(feats[:2], "packed"))
    both = adapter.flops(tiny_model, micro_batch(feats, "packed"))
    assert 0 < one.vision < both.vision
    assert both.total == both.text + both.vision
    # 6 · N · tokens is a lower bound of the text FLOPs (attention comes on top).
    lm = tiny_model.model.language_model
    dense = count_params(lm) + tiny_model.lm_head.weight.numel()
    tokens = sum(f.length for f in feats)
    if family == "qwen3_vl_moe":
        experts = sum(count_params(layer.mlp.experts) for layer in lm.layers)
        active = dense - experts // 2  # top-2 of 4 experts
        assert both.text == pytest.approx(
            6 * active * tokens + adapter._attention_flops(tiny_model, micro_batch(feats, "packed"))
        )
    else:
        assert both.text > 6 * dense * tokens


def test_mrope_matches_transformers(
    family: str,
    adapter: QwenVLAdapter,
    assets: ModelAssets,
    tiny_model: torch.nn.Module,
    samples: list[dict[str, Any]],
) -> None:
    """Our per-sample positions = transformers' ``get_rope_index`` on the same sample."""
    merge = tiny_model.config.vision_config.spatial_merge_size
    image_id = tiny_model.config.image_token_id
    for feat in features(adapter, assets, samples):
        grid = feat.media.get("image_grid_thw")
        ref, _ = tiny_model.model.get_rope_index(
            feat.input_ids[None],
            mm_token_type_ids=feat.token_fields["mm_token_type_ids"][None],
            image_grid_thw=grid,
        )
        ours = mrope_position_ids(
            feat.input_ids, grid, image_token_id=image_id, spatial_merge_size=merge
        )
        assert torch.equal(ours, ref[:, 0])
        assert torch.equal(feat.position_ids[1:], ours)
        assert torch.equal(feat.position_ids[0], torch.arange(feat.length))


def test_mrope_hand_checked() -> None:
    # text(2) | image 1×4×6 patches → 1×2×3 tokens | text(2)
    ids = torch.tensor([9, 9] + [5] * 6 + [9, 9])
    pos = mrope_position_ids(ids, torch.tensor([[1, 4, 6]]), image_token_id=5, spatial_merge_size=2)
    assert pos.tolist() == [
        [0, 1, 2, 2, 2, 2, 2, 2, 5, 6],
        [0, 1, 2, 2, 2, 3, 3, 3, 5, 6],
        [0, 1, 2, 3, 4, 2, 3, 4, 5, 6],
    ]
    with pytest.raises(ValueError, match="grid has"):
        mrope_position_ids(ids, torch.tensor([[1, 4, 4]]), image_token_id=5, spatial_merge_size=2)
