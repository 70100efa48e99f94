"""Export to the published checkpoint layout, loadable by ``from_pretrained``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from kimi_helpers import model_config
from safetensors import safe_open

from hyper_core.adapters.base import ModelAssets
from hyper_core.testing.vl import micro_batch
from hyper_kimi_k26.adapter import KimiK25Adapter


def read_safetensors(path: Path) -> dict[str, torch.Tensor]:
    out: dict[str, torch.Tensor] = {}
    for file in sorted(path.glob("*.safetensors")):
        with safe_open(str(file), "pt") as f:
            out.update({k: f.get_tensor(k) for k in f.keys()})
    return out


def perturbed(model: torch.nn.Module) -> torch.nn.Module:
    with torch.no_grad():  # make the weights differ from any init (biases, norms, gate bias)
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.02)
        for name, b in model.named_buffers():
            if name.endswith("e_score_correction_bias"):
                b.add_(torch.randn_like(b) * 0.1)
    return model


def test_export_layout_and_roundtrip(
    adapter: KimiK25Adapter,
    assets: ModelAssets,
    tiny_model: torch.nn.Module,
    samples: list[dict[str, Any]],
    tmp_path: Path,
) -> None:
    from transformers import Kimi_K25ForConditionalGeneration

    model = perturbed(tiny_model)
    out = tmp_path / "hf"
    adapter.export_hf(model.state_dict(), model.config, out, assets=assets)
    config = json.loads((out / "config.json").read_text())
    assert config["model_type"] == "kimi_k25"
    assert config["architectures"] == ["Kimi_K25ForConditionalGeneration"]
    assert (out / "tokenizer.json").is_file() and (out / "preprocessor_config.json").is_file()

    saved = read_safetensors(out)
    keys = set(saved)
    # per-expert keys, as the checkpoints store them (no fused in-memory tensors)
    assert not any("gate_up_proj" in k or k.endswith("experts.down_proj") for k in keys)
    experts = model.model.language_model.layers[1].mlp.experts
    for e in range(4):
        base = f"language_model.model.layers.1.mlp.experts.{e}"
        assert torch.equal(saved[f"{base}.gate_proj.weight"], experts.gate_up_proj[e, :32])
        assert torch.equal(saved[f"{base}.up_proj.weight"], experts.gate_up_proj[e, 32:])
        assert torch.equal(saved[f"{base}.down_proj.weight"], experts.down_proj[e])
    assert "language_model.model.layers.1.mlp.gate.e_score_correction_bias" in keys
    assert "language_model.model.layers.0.mlp.gate_proj.weight" in keys  # the dense layer
    assert "language_model.lm_head.weight" in keys
    assert saved["vision_tower.encoder.blocks.0.wqkv.weight"].shape == (96, 32)
    assert {
        "vision_tower.encoder.blocks.1.norm0.weight",
        "vision_tower.encoder.blocks.1.mlp.fc1.bias",
        "vision_tower.encoder.blocks.1.wo.weight",
        "vision_tower.encoder.final_layernorm.weight",
        "vision_tower.patch_embed.proj.weight",
        "vision_tower.patch_embed.pos_emb.weight",
        "mm_projector.pre_norm.weight",
        "mm_projector.proj.0.weight",
        "mm_projector.proj.2.bias",
    } <= keys
    assert not any(k.startswith("model.") or (".blocks." in k and "language" in k) for k in keys)

    # transformers reads it back through its own kimi_k25 conversion: the same model
    reloaded = Kimi_K25ForConditionalGeneration.from_pretrained(str(out), local_files_only=True)
    ours, theirs = model.state_dict(), reloaded.state_dict()
    assert ours.keys() == theirs.keys()
    for name, tensor in ours.items():
        assert torch.equal(tensor, theirs[name]), name
    feats = [adapter.transform(s, assets, max_seq_len=1024) for s in samples]
    mb = micro_batch(feats, "padded")
    model.eval()
    reloaded.eval()
    with torch.no_grad():
        a = model(**mb.model_inputs, use_cache=False).logits
        b = reloaded(**mb.model_inputs, use_cache=False).logits
    assert torch.allclose(a, b, atol=1e-5)

    # and the directory is a valid [model] path for the adapter again
    again = adapter.build_model(model_config(path=str(out)))
    assert all(torch.equal(t, again.state_dict()[n]) for n, t in ours.items())
    again_assets = adapter.build_assets(model_config(path=str(out)))
    assert again_assets.tokenizer.get_vocab() == assets.tokenizer.get_vocab()
    assert again_assets.processor.image_token_id == assets.processor.image_token_id


def test_matches_transformers_reverse_conversion(
    adapter: KimiK25Adapter, tiny_model: torch.nn.Module, tmp_path: Path
) -> None:
    """Same tensors as transformers' own save-time reversal (fused wqkv with the RoPE
    permutation undone, per-expert weights); only its key names differ where it is wrong
    (text ``layers`` renamed ``blocks``, ``model.mm_projector.pre_norm``)."""
    model = perturbed(tiny_model)
    adapter.export_hf(model.state_dict(), model.config, tmp_path / "ours")
    model.save_pretrained(str(tmp_path / "theirs"))
    ours = read_safetensors(tmp_path / "ours")
    theirs = read_safetensors(tmp_path / "theirs")

    def normalise(key: str) -> str:
        key = key.replace("language_model.model.blocks.", "language_model.model.layers.")
        key = key.replace("model.mm_projector.", "mm_projector.")
        return key.replace("vision_tower.encoder.patch_embed.", "vision_tower.patch_embed.")

    theirs = {normalise(k): v for k, v in theirs.items()}
    assert ours.keys() == theirs.keys()
    for key, tensor in ours.items():
        assert torch.equal(tensor, theirs[key]), key
