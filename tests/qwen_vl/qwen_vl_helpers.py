"""Helpers of the Qwen-VL adapter tests (shared VL data: :mod:`hyper_core.testing.vl`)."""

from __future__ import annotations

import functools
from typing import Any

import torch

from hyper_core.adapters.base import ModelAssets
from hyper_core.batching.types import MicroBatch
from hyper_core.config.schema import ModelConfig
from hyper_core.testing import vl
from hyper_qwen_vl.adapters import (
    Qwen2VLAdapter,
    Qwen3VLAdapter,
    Qwen3VLMoeAdapter,
    Qwen25VLAdapter,
    QwenVLAdapter,
)

ADAPTERS: dict[str, type[QwenVLAdapter]] = {
    "qwen2_vl": Qwen2VLAdapter,
    "qwen2_5_vl": Qwen25VLAdapter,
    "qwen3_vl": Qwen3VLAdapter,
    "qwen3_vl_moe": Qwen3VLMoeAdapter,
}
FAMILIES = list(ADAPTERS)


def model_config(name: str, **kwargs: Any) -> ModelConfig:
    """``[model]`` for adapter ``name`` (a tiny named config unless ``path`` is given)."""
    if "path" not in kwargs:
        kwargs.setdefault("config", "tiny")
    return ModelConfig(adapter=name, **kwargs)


@functools.cache
def cached_assets(name: str) -> ModelAssets:
    """The offline assets of adapter ``name`` (built once per session)."""
    return ADAPTERS[name]().build_assets(model_config(name))


def loss_of(model: torch.nn.Module, mb: MicroBatch, forward_kwargs: dict[str, Any]) -> torch.Tensor:
    """Sum of CE over the shifted labels / number of loss tokens, with ``forward_kwargs``."""
    return vl.loss_of(model, mb, forward_kwargs=forward_kwargs)
