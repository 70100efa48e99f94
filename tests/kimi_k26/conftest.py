"""Fixtures of the Kimi-K2.6 adapter tests: the tiny model, images on disk, samples."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from kimi_helpers import IMAGE_SIZES, cached_assets, chat, model_config
from PIL import Image

from hyper_core.adapters.base import ModelAssets
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
    root = tmp_path_factory.mktemp("images")
    rng = np.random.default_rng(0)
    for name, (h, w) in IMAGE_SIZES.items():
        pixels = rng.integers(0, 256, (h, w, 3), dtype=np.uint8)
        Image.fromarray(pixels).save(root / name)
    (root / "corrupt.png").write_bytes(b"\x89PNG\r\n\x1a\nthis is not a png")
    return root


@pytest.fixture
def samples(image_dir: Path) -> list[dict[str, Any]]:
    """A micro-batch with 0, 1 and 2 images of different sizes."""
    return [
        chat("What colour is the shape?", "a red circle", image_dir),
        chat(
            [{"type": "image", "image": "odd.png"}, {"type": "text", "text": "What shape is it?"}],
            "a square",
            image_dir,
            meta={"question": "shape"},
        ),
        chat(
            "<image>Describe the image.<image>",
            "a blue triangle",
            image_dir,
            images=["square.png", "wide.png"],
        ),
    ]
