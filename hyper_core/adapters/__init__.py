"""Model adapters."""

from .base import FlopsCount, ModelAdapter, ModelAssets, ParallelPlan, VisionEncoderSpec

__all__ = ["FlopsCount", "ModelAdapter", "ModelAssets", "ParallelPlan", "VisionEncoderSpec"]
