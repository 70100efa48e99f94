"""Memory-profiler tests: every test leaves no saved-tensor hooks behind."""

from __future__ import annotations

from typing import Any

import pytest


@pytest.fixture(autouse=True)
def _no_saved_tensor_hooks_left() -> Any:
    """Every test must leave no saved-tensor hooks installed (the meter removes its own)."""
    yield
    import torch

    assert torch._C._autograd._top_saved_tensors_default_hooks(False) is None
