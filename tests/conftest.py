"""Shared test setup: no network, quiet tokenizers, and a cache dir per session."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault(
    "HYPER_TRAIN_CACHE", os.path.join(os.path.dirname(__file__), "..", "runs", ".cache")
)
