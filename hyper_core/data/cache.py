"""The user cache folder of generated data sets and JSON-lines indexes."""

from __future__ import annotations

import os
from pathlib import Path


def cache_root() -> Path:
    """``$HYPER_TRAIN_CACHE`` or ``~/.cache/hyper-train``."""
    return Path(os.environ.get("HYPER_TRAIN_CACHE") or "~/.cache/hyper-train").expanduser()
