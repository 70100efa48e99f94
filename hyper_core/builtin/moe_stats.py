"""The core's MoE routing statistics (``moe/*`` metrics) of an expert-parallel run."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..hookspecs import hookimpl

if TYPE_CHECKING:
    from ..config import Config


@hookimpl
def build_callbacks(config: Config) -> Any:
    """:class:`~hyper_core.parallel.moe_stats.ExpertParallelStats` when ``[parallel] ep > 1``."""
    if config.parallel.ep <= 1:
        return None
    from ..parallel.moe_stats import ExpertParallelStats

    return ExpertParallelStats(config.parallel.ep)
