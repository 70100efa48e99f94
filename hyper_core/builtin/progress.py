"""The core's progress display: rank 0's bar or log lines (``[logging] progress``)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..hookspecs import hookimpl

if TYPE_CHECKING:
    from ..config import Config
    from ..parallel.env import DistEnv


@hookimpl
def build_callbacks(config: Config, dist: DistEnv) -> Any:
    """:class:`~hyper_core.trainer.progress.Progress` on rank 0."""
    if not dist.is_main:
        return None
    from ..trainer.progress import Progress

    return Progress(config, dist)
