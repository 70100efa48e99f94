"""pytest fixtures of a VL adapter's tests: pictures on disk and a micro-batch of samples.

Import them into a ``conftest.py`` to use them:
``from hyper_core.testing.vl_fixtures import image_dir, samples  # noqa: F401``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from .vl import vl_samples, write_test_images


@pytest.fixture(scope="session")
def image_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Random RGB pictures of odd sizes, plus a corrupt file."""
    return write_test_images(tmp_path_factory.mktemp("images"))


@pytest.fixture
def samples(image_dir: Path) -> list[dict[str, Any]]:
    """A micro-batch with 0, 1 and 2 images of different sizes."""
    return vl_samples(image_dir)
