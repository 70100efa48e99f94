"""Batching runtimes: samples → micro-batches."""

from .base import BatchingOptions, BatchingRuntime
from .types import IGNORE_INDEX, MicroBatch, SampleFeatures

__all__ = ["IGNORE_INDEX", "BatchingOptions", "BatchingRuntime", "MicroBatch", "SampleFeatures"]
