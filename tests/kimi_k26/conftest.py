"""Fixtures of the Kimi-K2.6 adapter tests: the tiny model, images on disk, samples."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from kimi_helpers import cached_assets, model_config

from hyper_core.adapters.base import ModelAssets
from hyper_core.testing.vl import vl_samples, write_test_images
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


@pytest.fixture(scope="session")
def image_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Random RGB pictures of odd sizes, plus a corrupt file."""
    return write_test_images(tmp_path_factory.mktemp("images"))


@pytest.fixture
def samples(image_dir: Path) -> list[dict[str, Any]]:
    """A micro-batch with 0, 1 and 2 images of different sizes."""
    return vl_samples(image_dir)
