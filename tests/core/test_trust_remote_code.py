"""``hf_causal_lm`` and a model directory whose code ships in it (config.json ``auto_map``):
trust on → the directory's class; trust off → one line naming ``$.model.trust_remote_code``."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from hyper_core.builtin.hf_causal_lm import HFCausalLMAdapter
from hyper_core.cli import main
from hyper_core.config import ModelConfig
from hyper_core.testing import tiny_text_config

CONFIG_CODE = """
from transformers import LlamaConfig


class TinyRemoteConfig(LlamaConfig):
    model_type = "tiny_remote"
"""

MODEL_CODE = """
from transformers import LlamaForCausalLM

from .configuration_tiny import TinyRemoteConfig


class TinyRemoteForCausalLM(LlamaForCausalLM):
    config_class = TinyRemoteConfig
    hyper_marker = "remote code"
"""


@pytest.fixture(autouse=True)
def modules_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Keep transformers' copies of dynamic modules inside the test's tmp dir."""
    from transformers import dynamic_module_utils

    cache = tmp_path / "hf_modules"
    monkeypatch.setattr(dynamic_module_utils, "HF_MODULES_CACHE", str(cache))
    monkeypatch.syspath_prepend(str(cache))
    yield
    for name in [n for n in sys.modules if n.startswith("transformers_modules")]:
        del sys.modules[name]


@pytest.fixture
def model_dir(tmp_path: Path) -> Path:
    """A tiny Llama saved as safetensors, re-labelled as a model type only its code knows."""
    from transformers import LlamaConfig, LlamaForCausalLM

    path = tmp_path / "model"
    config = LlamaConfig(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=1024,
        tie_word_embeddings=True,
    )
    torch.manual_seed(0)
    LlamaForCausalLM(config).save_pretrained(path)
    raw = json.loads((path / "config.json").read_text())
    raw["model_type"] = "tiny_remote"
    raw["auto_map"] = {
        "AutoConfig": "configuration_tiny.TinyRemoteConfig",
        "AutoModelForCausalLM": "modeling_tiny.TinyRemoteForCausalLM",
    }
    (path / "config.json").write_text(json.dumps(raw))
    (path / "configuration_tiny.py").write_text(CONFIG_CODE)
    (path / "modeling_tiny.py").write_text(MODEL_CODE)
    return path


def test_trust_on_builds_the_directorys_class_with_its_weights(model_dir: Path) -> None:
    from safetensors.torch import load_file

    adapter = HFCausalLMAdapter()
    cfg = ModelConfig(adapter="hf_causal_lm", path=str(model_dir), trust_remote_code=True)
    model = adapter.build_model(cfg)
    assert type(model).__name__ == "TinyRemoteForCausalLM"
    assert model.hyper_marker == "remote code"
    saved = load_file(str(model_dir / "model.safetensors"))
    state = model.state_dict()
    for name, tensor in saved.items():
        assert torch.equal(tensor, state[name]), name
    assert type(adapter.build_model(cfg, device="meta")).__name__ == "TinyRemoteForCausalLM"


def test_trust_off_is_one_line_naming_the_key(
    model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import tomli_w

    raw = tiny_text_config(tmp_path / "run")
    raw["model"] = {"adapter": "hf_causal_lm", "path": str(model_dir)}
    toml = tmp_path / "remote.toml"
    toml.write_text(tomli_w.dumps(raw))
    assert main(["run", str(toml)]) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert err.startswith("hyper-train: error: $.model.trust_remote_code: ")
    assert not any(n.startswith("transformers_modules") for n in sys.modules)
