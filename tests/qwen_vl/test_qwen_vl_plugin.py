"""The entry point: lazy registrations, no torch/transformers at import time."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from hyper_core.plugins import PluginHost
from hyper_qwen_vl.adapters import (
    Qwen2VLAdapter,
    Qwen3VLAdapter,
    Qwen3VLMoeAdapter,
    Qwen25VLAdapter,
)


def test_plugin_imports_no_torch() -> None:
    code = (
        "import json, sys; import hyper_qwen_vl.plugin, hyper_qwen_vl.configs;"
        "print(json.dumps(sorted(m for m in ('torch', 'transformers', 'PIL') if m in sys.modules)))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert json.loads(out.stdout) == []


def test_entry_point_registers_adapters() -> None:
    host = PluginHost(only=["qwen_vl"], strict=True)
    record = host.records["qwen_vl"]
    assert record.status == "loaded" and record.distribution == "hyper-train-qwen-vl"
    reg = host.registries.model_adapters
    expected = {
        "qwen2_vl": Qwen2VLAdapter,
        "Qwen2VLForConditionalGeneration": Qwen2VLAdapter,
        "qwen2_5_vl": Qwen25VLAdapter,
        "Qwen2_5_VLForConditionalGeneration": Qwen25VLAdapter,
        "qwen2.5-vl": Qwen25VLAdapter,
        "qwen3_vl": Qwen3VLAdapter,
        "Qwen3VLForConditionalGeneration": Qwen3VLAdapter,
        "qwen3_vl_moe": Qwen3VLMoeAdapter,
        "Qwen3VLMoeForConditionalGeneration": Qwen3VLMoeAdapter,
    }
    for name, cls in expected.items():
        entry = reg.entry(name)
        assert entry.plugin == "qwen_vl"
        assert isinstance(entry.ref, str)  # lazy
        assert entry.load() is cls
        assert cls.name == entry.name
    assert set(reg.names()) >= {"qwen2_vl", "qwen2_5_vl", "qwen3_vl", "qwen3_vl_moe"}


def test_adapter_found_from_model_dir(tmp_path: Path) -> None:
    from hyper_core.config.schema import ModelConfig
    from hyper_core.resolve import resolve_adapter

    Qwen3VLMoeAdapter().hf_config(
        ModelConfig(adapter="qwen3_vl_moe", config="tiny")
    ).save_pretrained(str(tmp_path))
    host = PluginHost(only=["qwen_vl"], strict=True)
    adapter = resolve_adapter(ModelConfig(path=str(tmp_path)), host.registries)
    assert isinstance(adapter, Qwen3VLMoeAdapter)
