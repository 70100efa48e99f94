"""``trust_remote_code``: off → native classes even when the directory ships modeling code
(which is never imported); on → the directory's class named by config.json ``auto_map``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from kimi_helpers import model_config

from hyper_core.adapters.base import ModelAssets
from hyper_kimi_k26.adapter import KimiK25Adapter

MARKED = """
from transformers import Kimi_K25ForConditionalGeneration


class MarkedKimi(Kimi_K25ForConditionalGeneration):
    hyper_marker = "remote code"
"""

BOOBY_TRAP = """
raise RuntimeError("remote code was executed although trust_remote_code is false")
"""


def model_dir(
    adapter: KimiK25Adapter, model: torch.nn.Module, assets: ModelAssets, path: Path, code: str
) -> Path:
    adapter.export_hf(model.state_dict(), model.config, path, assets=assets)
    raw = json.loads((path / "config.json").read_text())
    raw["auto_map"] = {
        "AutoConfig": "configuration_marked.MarkedConfig",
        "AutoModel": "modeling_marked.MarkedKimi",
        "AutoModelForCausalLM": "modeling_marked.MarkedKimi",
    }
    (path / "config.json").write_text(json.dumps(raw))
    (path / "modeling_marked.py").write_text(code)
    config_code = (
        "from transformers import Kimi_K25Config\n\n\n"
        "class MarkedConfig(Kimi_K25Config):\n    pass\n"
    )
    if "raise" in code:
        config_code = code
    (path / "configuration_marked.py").write_text(config_code)
    return path


@pytest.fixture(autouse=True)
def modules_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Keep transformers' copies of dynamic modules inside the test's tmp dir."""
    import sys

    from transformers import dynamic_module_utils

    cache = tmp_path / "hf_modules"
    monkeypatch.setattr(dynamic_module_utils, "HF_MODULES_CACHE", str(cache))
    monkeypatch.syspath_prepend(str(cache))
    yield
    for name in [n for n in sys.modules if n.startswith("transformers_modules")]:
        del sys.modules[name]


def test_flag_off_never_imports_remote_code(
    adapter: KimiK25Adapter, tiny_model: torch.nn.Module, assets: ModelAssets, tmp_path: Path
) -> None:
    path = model_dir(adapter, tiny_model, assets, tmp_path / "model", BOOBY_TRAP)
    cfg = model_config(path=str(path))
    assert cfg.trust_remote_code is False
    model = adapter.build_model(cfg)  # would raise if modeling_marked.py were imported
    assert type(model).__name__ == "Kimi_K25ForConditionalGeneration"
    assert not hasattr(model, "hyper_marker")
    assert (
        type(adapter.build_model(cfg, device="meta")).__name__ == "Kimi_K25ForConditionalGeneration"
    )
    adapter.build_assets(cfg)
    for name, tensor in tiny_model.state_dict().items():
        assert torch.equal(tensor, model.state_dict()[name]), name


def test_flag_on_uses_the_directory_class(
    adapter: KimiK25Adapter, tiny_model: torch.nn.Module, assets: ModelAssets, tmp_path: Path
) -> None:
    path = model_dir(adapter, tiny_model, assets, tmp_path / "model", MARKED)
    cfg = model_config(path=str(path), trust_remote_code=True)
    meta = adapter.build_model(cfg, device="meta")
    assert type(meta).__name__ == "MarkedKimi" and meta.hyper_marker == "remote code"
    assert type(meta.config).__name__ == "MarkedConfig"
    model = adapter.build_model(cfg)  # weights through the remote class's from_pretrained
    assert model.hyper_marker == "remote code"
    for name, tensor in tiny_model.state_dict().items():
        assert torch.equal(tensor, model.state_dict()[name]), name
    # the plan follows the module names of the class (here: the native layout)
    assert adapter.parallel_plan(model).vision_encoder.module == "model.vision_tower"


def test_flag_on_without_auto_map_is_native(
    adapter: KimiK25Adapter, tiny_model: torch.nn.Module, assets: ModelAssets, tmp_path: Path
) -> None:
    adapter.export_hf(tiny_model.state_dict(), tiny_model.config, tmp_path / "m", assets=assets)
    model = adapter.build_model(
        model_config(path=str(tmp_path / "m"), trust_remote_code=True), device="meta"
    )
    assert type(model).__name__ == "Kimi_K25ForConditionalGeneration"
