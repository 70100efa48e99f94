"""Deprecated: the step loader is :mod:`hyper_core.data.step_loader` (issue #32: ``loader``
named two unrelated modules, this and :mod:`hyper_core.config.loader`). This module re-exports
its public names and will be removed."""

from __future__ import annotations

import warnings

from .step_loader import RankShare, StepBatch, StepLoader, StepSampler, rank_slice

warnings.warn(
    "hyper_core.data.loader is deprecated: import from hyper_core.data.step_loader",
    DeprecationWarning,
    stacklevel=2,
)

__all__ = ["RankShare", "StepBatch", "StepLoader", "StepSampler", "rank_slice"]
