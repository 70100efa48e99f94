"""The core's step profiler: ``torch.profiler`` over ``[logging] profile_steps``."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..hookspecs import hookimpl

if TYPE_CHECKING:
    from ..config import Config
    from ..parallel.env import DistEnv


@hookimpl
def build_callbacks(config: Config, dist: DistEnv) -> Any:
    """:class:`~hyper_core.trainer.profile.StepProfiler` when ``profile_steps`` is set."""
    if not config.logging.profile_steps:
        return None
    from ..trainer.profile import StepProfiler

    first, last = config.logging.profile_steps
    return StepProfiler(first, last, config.run.output_dir, dist.rank)
