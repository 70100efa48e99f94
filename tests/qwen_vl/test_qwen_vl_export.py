"""Weights from a local HF directory, and export back to one that transformers loads."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from qwen_vl_helpers import ADAPTERS, model_config

from hyper_core.adapters.base import ModelAssets
from hyper_core.errors import UserError
from hyper_core.registry import import_ref
from hyper_core.testing.vl import micro_batch
from hyper_qwen_vl.adapters import QwenVLAdapter


def save_model_dir(model: torch.nn.Module, assets: ModelAssets, out: Path) -> Path:
    model.save_pretrained(str(out), safe_serialization=True)
    assets.save(out)
    return out


def test_weights_from_local_dir(
    family: str,
    adapter: QwenVLAdapter,
    assets: ModelAssets,
    tiny_model: torch.nn.Module,
    tmp_path: Path,
) -> None:
    path = save_model_dir(tiny_model, assets, tmp_path / "model")
    assert list(path.glob("*.safetensors"))
    assert (path / "tokenizer.json").is_file() and (path / "preprocessor_config.json").is_file()
    loaded = adapter.build_model(model_config(family, path=str(path)))
    ours = tiny_model.state_dict()
    theirs = loaded.state_dict()
    assert ours.keys() == theirs.keys()
    for name, tensor in ours.items():
        assert torch.equal(tensor, theirs[name]), name
    # the tokenizer now comes from the directory, and agrees with the demo one
    from_dir = adapter.build_assets(model_config(family, path=str(path)))
    assert from_dir.tokenizer is not assets.tokenizer
    assert from_dir.tokenizer.get_vocab() == assets.tokenizer.get_vocab()
    assert from_dir.processor.image_token_id == assets.processor.image_token_id
    # meta construction from a directory (for sharding)
    meta = adapter.build_model(model_config(family, path=str(path)), device="meta")
    assert {p.device.type for p in meta.parameters()} == {"meta"}


def test_export_hf_roundtrip(
    family: str,
    adapter: QwenVLAdapter,
    assets: ModelAssets,
    tiny_model: torch.nn.Module,
    samples: list[dict[str, Any]],
    tmp_path: Path,
) -> None:
    with torch.no_grad():  # make the weights differ from any init
        for p in tiny_model.parameters():
            p.add_(torch.randn_like(p) * 0.01)
    out = tmp_path / "hf"
    adapter.export_hf(tiny_model.state_dict(), tiny_model.config, out, assets=assets)
    assert list(out.glob("*.safetensors")) and (out / "config.json").is_file()
    assert json.loads((out / "config.json").read_text())["model_type"] == family
    cls = import_ref(adapter.model_class)
    reloaded = cls.from_pretrained(str(out), local_files_only=True)
    feats = [adapter.transform(s, assets, max_seq_len=1024) for s in samples]
    mb = micro_batch(feats, "padded")
    tiny_model.eval()
    reloaded.eval()
    with torch.no_grad():
        a = tiny_model(**mb.model_inputs, use_cache=False).logits
        b = reloaded(**mb.model_inputs, use_cache=False).logits
    assert torch.allclose(a, b, atol=1e-5)
    # and the exported directory is a valid [model] path for the adapter again
    again = adapter.build_assets(model_config(family, path=str(out)))
    assert again.tokenizer.get_vocab() == assets.tokenizer.get_vocab()


def test_path_of_another_family(tmp_path: Path) -> None:
    model = ADAPTERS["qwen2_vl"]().build_model(model_config("qwen2_vl"))
    model.save_pretrained(str(tmp_path))
    with pytest.raises(UserError, match="'qwen2_vl' model but adapter 'qwen3_vl'"):
        ADAPTERS["qwen3_vl"]().build_model(model_config("qwen3_vl", path=str(tmp_path)))


def test_path_without_tokenizer_needs_matching_ids(tmp_path: Path) -> None:
    """A directory without tokenizer files falls back to the demo tokenizer, whose special
    token ids must match the config (a real Qwen config would not)."""
    adapter = ADAPTERS["qwen2_5_vl"]()
    cfg = adapter.hf_config(model_config("qwen2_5_vl"))
    cfg.save_pretrained(str(tmp_path))
    assets = adapter.build_assets(model_config("qwen2_5_vl", path=str(tmp_path)))
    assert assets.processor.image_token_id == cfg.image_token_id
    cfg.image_token_id = 151655
    cfg.save_pretrained(str(tmp_path))
    with pytest.raises(UserError, match="image_token_id = 151655"):
        adapter.build_assets(model_config("qwen2_5_vl", path=str(tmp_path)))


def test_named_config_558k() -> None:
    adapter = ADAPTERS["qwen2_5_vl"]()
    model = adapter.build_model(model_config("qwen2_5_vl", config="tiny-558k"), device="meta")
    assert model.config.text_config.hidden_size == 128
    assert model.config.vision_config.hidden_size == 64
    assert 550_000 < sum(p.numel() for p in model.parameters()) < 566_000
