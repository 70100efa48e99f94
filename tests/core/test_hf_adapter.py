"""The shared transformers adapter base: named configs, overrides, local directories."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from hyper_core.adapters.hf import merge_overrides
from hyper_core.builtin.hf_causal_lm import HFCausalLMAdapter
from hyper_core.config import ModelConfig
from hyper_core.errors import ConfigError, UserError


def test_merge_overrides_nested_and_dotted() -> None:
    base = {"a": 1, "text_config": {"hidden_size": 64, "layers": 2}}
    merged = merge_overrides(base, {"text_config.hidden_size": 128, "text_config": {"layers": 4}})
    assert merged == {"a": 1, "text_config": {"hidden_size": 128, "layers": 4}}
    assert base["text_config"]["hidden_size"] == 64  # not mutated


def test_overrides_reach_derived_fields() -> None:
    adapter = HFCausalLMAdapter()
    cfg = adapter.hf_config(
        ModelConfig(
            adapter="hf_causal_lm", config="tiny-qwen2", hf_overrides={"num_hidden_layers": 3}
        )
    )
    assert cfg.num_hidden_layers == 3
    assert len(cfg.layer_types) == 3
    model = adapter.build_model(
        ModelConfig(
            adapter="hf_causal_lm", config="tiny-qwen2", hf_overrides={"num_hidden_layers": 3}
        )
    )
    assert len(model.model.layers) == 3


def test_unknown_named_config_lists_the_available_ones() -> None:
    with pytest.raises(ConfigError, match=r"\$\.model\.config.*tiny-llama"):
        HFCausalLMAdapter().hf_config(ModelConfig(adapter="hf_causal_lm", config="huge"))


def test_local_directory_round_trip_and_safetensors_only(tmp_path: Path) -> None:
    adapter = HFCausalLMAdapter()
    model = adapter.build_model(ModelConfig(adapter="hf_causal_lm", config="tiny-llama"))
    model.save_pretrained(tmp_path / "m")
    loaded = adapter.build_model(ModelConfig(adapter="hf_causal_lm", path=str(tmp_path / "m")))
    for (k, a), (_, b) in zip(model.state_dict().items(), loaded.state_dict().items(), strict=True):
        assert torch.equal(a, b), k
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "config.json").write_text((tmp_path / "m" / "config.json").read_text())
    torch.save(model.state_dict(), tmp_path / "bin" / "pytorch_model.bin")
    with pytest.raises(UserError, match="safetensors"):
        adapter.build_model(ModelConfig(adapter="hf_causal_lm", path=str(tmp_path / "bin")))
