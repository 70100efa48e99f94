"""Fixtures of the Kimi-K2.6 adapter tests: the tiny model, images on disk, samples."""

from __future__ import annotations

import pytest
import torch
from kimi_helpers import cached_assets, model_config

from hyper_core.adapters.base import ModelAssets
from hyper_core.testing.vl_fixtures import image_dir, samples  # noqa: F401 (fixtures)
from hyper_kimi_k26.adapter import KimiK25Adapter


@pytest.fixture
def adapter() -> KimiK25Adapter:
    """A fresh adapter."""
    return KimiK25Adapter()


@pytest.fixture
def assets() -> ModelAssets:
    """The offline tokenizer and processor (built once per session)."""
    return cached_assets()


@pytest.fixture
def tiny_model(adapter: KimiK25Adapter) -> torch.nn.Module:
    """A randomly initialised tiny model (seeded)."""
    torch.manual_seed(0)
    return adapter.build_model(model_config())
