"""Helpers of the Kimi-K2.6 adapter tests (a uniquely named module, importable from the tests)."""

from __future__ import annotations

import functools
from typing import Any

from hyper_core.adapters.base import ModelAssets
from hyper_core.config.schema import ModelConfig
from hyper_kimi_k26.adapter import KimiK25Adapter


def model_config(**kwargs: Any) -> ModelConfig:
    """``[model]`` for the adapter (the tiny named config unless ``path`` is given)."""
    if "path" not in kwargs:
        kwargs.setdefault("config", "tiny")
    kwargs.setdefault("adapter", "kimi_k25")
    return ModelConfig(**kwargs)


@functools.cache
def cached_assets() -> ModelAssets:
    """The offline assets (built once per session)."""
    return KimiK25Adapter().build_assets(model_config())
