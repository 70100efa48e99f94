"""Fixtures of the Qwen-VL adapter tests: tiny models, images on disk, samples."""

from __future__ import annotations

import pytest
import torch
from qwen_vl_helpers import ADAPTERS, FAMILIES, cached_assets, model_config

from hyper_core.adapters.base import ModelAssets
from hyper_core.testing.vl_fixtures import image_dir, samples  # noqa: F401 (fixtures)
from hyper_qwen_vl.adapters import QwenVLAdapter


@pytest.fixture(params=FAMILIES)
def family(request: pytest.FixtureRequest) -> str:
    """Each of the four model types."""
    return request.param


@pytest.fixture
def adapter(family: str) -> QwenVLAdapter:
    """The family's adapter."""
    return ADAPTERS[family]()


@pytest.fixture
def assets(family: str) -> ModelAssets:
    """The family's offline tokenizer and processor (built once per session)."""
    return cached_assets(family)


@pytest.fixture
def tiny_model(family: str, adapter: QwenVLAdapter) -> torch.nn.Module:
    """A randomly initialised tiny model (seeded)."""
    torch.manual_seed(0)
    return adapter.build_model(model_config(family))
