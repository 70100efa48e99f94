"""``[training] liger_kernel``: liger-kernel's fused kernels give the model's loss and gradients
(on CUDA, where its Triton kernels run); elsewhere, or without the package, one clear error."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from hyper_core.config import load_config_dict
from hyper_core.errors import ConfigError
from hyper_core.parallel.liger import apply_liger_kernel
from hyper_core.plugins import get_plugin_host
from hyper_core.resolve import resolve_adapter
from hyper_core.testing import run_tiny_training, tiny_text_config
from hyper_core.testing.vl import loss_and_grads, micro_batch, vl_samples, write_test_images


def test_off_cuda_the_run_stops_naming_the_option(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as err:
        run_tiny_training(tiny_text_config(tmp_path, training={"liger_kernel": True}), steps=1)
    [(path, message)] = err.value.problems
    assert path == "$.training.liger_kernel" and "need CUDA" in message


def test_without_the_package_the_error_says_what_to_install(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "liger_kernel", None)  # not installed (an ImportError)
    with pytest.raises(ConfigError) as err:
        apply_liger_kernel(torch.nn.Linear(2, 2), torch.device("cuda"))
    [(path, message)] = err.value.problems
    assert path == "$.training.liger_kernel" and "pip install 'hyper-train[liger]'" in message


def _build(tmp_path: Path) -> tuple[Any, Any, Any]:
    raw = {
        "run": {"output_dir": str(tmp_path / "run")},
        "model": {"adapter": "qwen2_5_vl", "config": "tiny", "attn_implementation": "sdpa"},
        "data": {"train": {"format": "shapes", "num_samples": 4}},
        "training": {"steps": 1, "global_batch_size": 2, "micro_batch_size": 1, "lr": 1e-3},
    }
    config = load_config_dict(raw)
    adapter = resolve_adapter(config.model, get_plugin_host().registries)
    torch.manual_seed(0)
    return adapter, adapter.build_model(config.model), adapter.build_assets(config.model)


@pytest.mark.gpu
def test_liger_kernels_give_the_models_loss_and_gradients_on_cuda(tmp_path: Path) -> None:
    """Tiny Qwen2.5-VL, fp32 on CUDA: the reference first (liger's RoPE patch is process-wide)."""
    results = []
    for liger in (False, True):
        adapter, model, assets = _build(tmp_path)
        model.to("cuda")
        if liger:
            assert apply_liger_kernel(model, torch.device("cuda")) == "qwen2_5_vl"
        images = write_test_images(tmp_path / "images")
        feats = [adapter.transform(s, assets, max_seq_len=4096) for s in vl_samples(images)[:3]]
        mb = micro_batch(feats, "packed", assets.pad_token_id)
        mb.model_inputs, mb.loss_inputs = (
            {k: v.to("cuda") if isinstance(v, torch.Tensor) else v for k, v in d.items()}
            for d in (mb.model_inputs, mb.loss_inputs)
        )
        results.append(loss_and_grads(model, mb))
    (loss, grads), (want_loss, want_grads) = results[1], results[0]
    assert loss == pytest.approx(want_loss, rel=1e-4)
    for name, grad in want_grads.items():
        torch.testing.assert_close(grads[name], grad, rtol=1e-3, atol=1e-4, msg=name)
