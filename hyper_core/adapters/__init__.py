"""Model adapters."""

from .base import (
    ContextParallelAdapter,
    FlopsCount,
    ModelAdapter,
    ModelAssets,
    ParallelPlan,
    VisionEncoderSpec,
)
from .vision_context import VisionContext

__all__ = [
    "ContextParallelAdapter",
    "FlopsCount",
    "ModelAdapter",
    "ModelAssets",
    "ParallelPlan",
    "VisionContext",
    "VisionEncoderSpec",
]
