"""The entry point: lazy registrations, no torch/transformers at import time."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from hyper_core.config.schema import ModelConfig
from hyper_core.plugins import PluginHost
from hyper_core.resolve import resolve_adapter
from hyper_kimi_k26.adapter import KimiK25Adapter


def test_plugin_imports_no_torch() -> None:
    code = (
        "import json, sys; import hyper_kimi_k26, hyper_kimi_k26.plugin, hyper_kimi_k26.configs,"
        " hyper_kimi_k26.tokens;"
        "print(json.dumps(sorted(m for m in ('torch', 'transformers', 'PIL', 'numpy')"
        " if m in sys.modules)))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert json.loads(out.stdout) == []


def test_entry_point_registers_adapter_and_aliases() -> None:
    host = PluginHost(only=["kimi_k26"], strict=True)
    record = host.records["kimi_k26"]
    assert record.status == "loaded" and record.distribution == "hyper-train-kimi-k26"
    reg = host.registries.model_adapters
    for name in (
        "kimi_k25",
        "kimi_k26",
        "kimi-k26",
        "KimiK25ForConditionalGeneration",
        "KimiK26ForConditionalGeneration",
        "Kimi_K25ForConditionalGeneration",
    ):
        entry = reg.entry(name)
        assert entry.plugin == "kimi_k26" and entry.name == "kimi_k25"
        assert isinstance(entry.ref, str)  # lazy
        assert entry.load() is KimiK25Adapter
    assert KimiK25Adapter.name == "kimi_k25"


def test_adapter_found_from_model_dir(tmp_path: Path) -> None:
    KimiK25Adapter().hf_config(ModelConfig(adapter="kimi_k25", config="tiny")).save_pretrained(
        str(tmp_path)
    )
    host = PluginHost(only=["kimi_k26"], strict=True)
    adapter = resolve_adapter(ModelConfig(path=str(tmp_path)), host.registries)
    assert isinstance(adapter, KimiK25Adapter)


def test_kimi_is_a_context_parallel_adapter() -> None:
    from hyper_core.adapters import ContextParallelAdapter
    from hyper_core.parallel.context_parallel import RowSplit

    adapter = KimiK25Adapter()
    assert isinstance(adapter, ContextParallelAdapter)
    assert adapter.vision_grid_keyword() == "grid_thw"  # MoonViT's keyword
    assert adapter.split_decoder_kwargs({"input_ids": None}, RowSplit(2, 0)) == {}
