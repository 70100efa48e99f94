"""Shared test setup: no network, quiet tokenizers, a cache dir per session, and torch's
thread count given back after each test."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault(
    "HYPER_TRAIN_CACHE", os.path.join(os.path.dirname(__file__), "..", "runs", ".cache")
)


@pytest.fixture(autouse=True)
def _torch_threads_given_back() -> Iterator[None]:
    """A test that sets ``torch.set_num_threads(1)`` (as a rank does) must not leave every later
    in-process test on one thread (the Gemma demo took 167 s instead of 133 s)."""
    torch = sys.modules.get("torch")
    before = torch.get_num_threads() if torch is not None else None
    yield
    torch = sys.modules.get("torch")
    if torch is None:
        return
    if before is None:  # torch's default, as the first import chose it
        before = int(os.environ.get("OMP_NUM_THREADS") or os.cpu_count() or 1)
    if torch.get_num_threads() != before:
        torch.set_num_threads(before)
