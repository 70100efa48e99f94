"""Loading an HF directory into a meta-built model (the sharded path, here on one process):
exact weights, tied parameters, and one clear error for an incomplete or wrong checkpoint."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from hyper_core.config import load_config_dict
from hyper_core.errors import UserError
from hyper_core.parallel.env import DistEnv
from hyper_core.parallel.hf_load import load_hf_shards, weight_files
from hyper_core.parallel.materialize import materialize_buffers
from hyper_core.plugins import get_plugin_host
from hyper_core.resolve import resolve_adapter
from hyper_core.testing import tiny_text_config


def _model_config(path: Path) -> Any:
    raw = tiny_text_config(path.parent / "run")
    raw["model"] = {"adapter": "hf_causal_lm", "path": str(path)}
    return load_config_dict(raw).model


def _save(tmp_path: Path, **save: Any) -> Path:
    """A tiny Qwen2 (tied embeddings) saved as HF would, from the named config."""
    raw = tiny_text_config(tmp_path / "run")
    config = load_config_dict(raw)
    adapter = resolve_adapter(config.model, get_plugin_host().registries)
    torch.manual_seed(0)
    model = adapter.build_model(config.model)
    out = tmp_path / "hf"
    model.save_pretrained(str(out), **save)
    return out


def _load(path: Path) -> torch.nn.Module:
    model_config = _model_config(path)
    adapter = resolve_adapter(model_config, get_plugin_host().registries)
    model = adapter.build_model(model_config, device="meta")
    conversions = adapter.checkpoint_conversions(model)
    materialize_buffers(model, torch.device("cpu"))
    load_hf_shards(model, path, DistEnv(device=torch.device("cpu")), conversions)
    return model


def _reference(path: Path) -> torch.nn.Module:
    model_config = _model_config(path)
    return resolve_adapter(model_config, get_plugin_host().registries).build_model(model_config)


def test_loads_what_from_pretrained_loads_with_ties_kept(tmp_path: Path) -> None:
    path = _save(tmp_path, max_shard_size="100KB")
    assert len(weight_files(path)) > 1  # an index and several files
    model, reference = _load(path), _reference(path)
    assert model.lm_head.weight is model.get_input_embeddings().weight
    ours, theirs = model.state_dict(), reference.state_dict()
    assert ours.keys() == theirs.keys()
    for name, tensor in theirs.items():
        assert torch.equal(ours[name], tensor), name
    for name, buf in reference.named_buffers():  # non-persistent ones (rotary) recomputed
        assert torch.equal(dict(model.named_buffers())[name], buf), name


def test_a_missing_weight_is_named(tmp_path: Path) -> None:
    from safetensors.torch import load_file, save_file

    path = _save(tmp_path)
    tensors = load_file(path / "model.safetensors")
    del tensors["model.layers.1.mlp.up_proj.weight"]
    save_file(tensors, path / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(UserError, match=r"lacks 1 weight.*model\.layers\.1\.mlp\.up_proj\.weight"):
        _load(path)


def test_a_wrong_shape_is_named(tmp_path: Path) -> None:
    from safetensors.torch import load_file, save_file

    path = _save(tmp_path)
    tensors = load_file(path / "model.safetensors")
    tensors["model.norm.weight"] = torch.ones(3)
    save_file(tensors, path / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(UserError, match=r"model\.norm\.weight has shape \(3,\)"):
        _load(path)


def test_an_index_naming_a_missing_file_is_a_user_error(tmp_path: Path) -> None:
    path = _save(tmp_path, max_shard_size="100KB")
    index = json.loads((path / "model.safetensors.index.json").read_text())
    victim = sorted(set(index["weight_map"].values()))[-1]
    (path / victim).unlink()
    with pytest.raises(UserError, match=f"names 1 missing file.*{victim}"):
        weight_files(path)


def test_no_weights_is_a_user_error(tmp_path: Path) -> None:
    with pytest.raises(UserError, match=r"\$\.model\.path: .* has no \*\.safetensors"):
        weight_files(tmp_path)


def test_a_bf16_checkpoint_loads_into_fp32_parameters(tmp_path: Path) -> None:
    """fp32 master weights from a bf16 checkpoint (the published Qwen and Kimi weights)."""
    from safetensors import safe_open

    path = _save(tmp_path)
    reference = _reference(path)
    bf16 = reference.to(torch.bfloat16)
    bf16.save_pretrained(str(tmp_path / "bf16"))
    with safe_open(str(tmp_path / "bf16" / "model.safetensors"), "pt") as f:
        assert f.get_tensor("model.norm.weight").dtype == torch.bfloat16
    model = _load(tmp_path / "bf16")
    for name, tensor in model.state_dict().items():
        assert tensor.dtype == torch.float32, name
        assert torch.equal(tensor, bf16.state_dict()[name].float()), name
