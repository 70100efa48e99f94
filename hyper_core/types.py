"""The value objects that flow between build stages, in one place for plugin authors."""

from __future__ import annotations

from typing import Any

import attrs

from .adapters.base import FlopsCount, ModelAssets, ParallelPlan, VisionEncoderSpec
from .batching.types import IGNORE_INDEX, MicroBatch, SampleFeatures
from .parallel.env import DistEnv
from .trainer.state import TrainState


@attrs.define(kw_only=True)
class DatasetSplits:
    """The datasets of a run (``build_dataset``'s result)."""

    train: Any
    eval: Any = None


@attrs.define(kw_only=True)
class DataLoaders:
    """The loaders of a run (``build_dataloader``'s result)."""

    train: Any
    eval: Any = None


__all__ = [
    "IGNORE_INDEX",
    "DataLoaders",
    "DatasetSplits",
    "DistEnv",
    "FlopsCount",
    "MicroBatch",
    "ModelAssets",
    "ParallelPlan",
    "SampleFeatures",
    "TrainState",
    "VisionEncoderSpec",
]
