"""Model adapters."""

from .base import (
    ContextParallelAdapter,
    FlopsCount,
    ModelAdapter,
    ModelAssets,
    ParallelPlan,
    VisionEncoderSpec,
)

__all__ = [
    "ContextParallelAdapter",
    "FlopsCount",
    "ModelAdapter",
    "ModelAssets",
    "ParallelPlan",
    "VisionEncoderSpec",
]
