"""MFU's peak: by device variant and compute dtype; TF32 on CUDA; a tied LM head counted."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from hyper_core.config import load_config_dict
from hyper_core.testing import tiny_text_config
from hyper_core.trainer.peak_flops import compute_dtype, peak_flops


@pytest.mark.parametrize(
    ("name", "dtype", "peak"),
    [
        ("NVIDIA H200", "bf16", 989e12),
        ("NVIDIA H200 NVL", "bf16", 835e12),
        ("NVIDIA H100 80GB HBM3", "tf32", 494e12),
        ("NVIDIA H100 PCIe", "bf16", 756e12),
        ("NVIDIA H100 NVL", "fp32", 60e12),
        ("NVIDIA A100-SXM4-80GB", "bf16", 312e12),
        ("NVIDIA GeForce RTX 4090", "bf16", None),
    ],
)
def test_peaks_by_variant_and_dtype(name: str, dtype: Any, peak: float | None) -> None:
    assert peak_flops(name, dtype) == peak


@pytest.mark.parametrize(
    ("sections", "dtype"),
    [
        ({}, "tf32"),
        ({"training": {"tf32": False}}, "fp32"),
        ({"training": {"mixed_precision": "bf16"}}, "bf16"),
        ({"parallel": {"strategy": "fsdp2", "param_dtype": "bfloat16"}}, "bf16"),
        (
            {"model": {"adapter": "hf_causal_lm", "config": "tiny-qwen2", "dtype": "bfloat16"}},
            "bf16",
        ),
    ],
)
def test_the_compute_dtype_of_a_config(tmp_path: Path, sections: Any, dtype: str) -> None:
    assert compute_dtype(load_config_dict(tiny_text_config(tmp_path, **sections))) == dtype


def test_use_tf32_sets_the_matmul_precision() -> None:
    from hyper_core.parallel.setup import use_tf32

    before = torch.get_float32_matmul_precision()
    try:
        use_tf32(True)
        assert torch.get_float32_matmul_precision() == "high"
        use_tf32(False)
        assert torch.get_float32_matmul_precision() == "highest"
    finally:
        torch.set_float32_matmul_precision(before)


def test_a_tied_lm_head_is_counted_in_the_flops(tmp_path: Path) -> None:
    from hyper_core.plugins import get_plugin_host
    from hyper_core.resolve import resolve_adapter
    from hyper_core.testing.vl import micro_batch

    config = load_config_dict(tiny_text_config(tmp_path))
    adapter = resolve_adapter(config.model, get_plugin_host().registries)
    model = adapter.build_model(config.model)
    assert model.lm_head.weight is model.get_input_embeddings().weight  # tiny-qwen2 ties
    assets = adapter.build_assets(config.model)
    sample = {
        "messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]
    }
    mb = micro_batch([adapter.transform(sample, assets, max_seq_len=64)], "packed")
    flops = adapter.flops(model, mb).text
    head = model.lm_head.weight.numel()
    body = sum(p.numel() for n, p in model.named_parameters() if "embed" not in n)
    assert flops >= 6.0 * (body + head) * mb.num_tokens
