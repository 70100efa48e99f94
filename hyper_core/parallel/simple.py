"""The ``none`` and ``ddp`` strategies."""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Any

from .base import ParallelStrategy

if TYPE_CHECKING:
    import torch

    from ..adapters.base import ParallelPlan
    from .env import DistEnv


class NoParallel(ParallelStrategy):
    """One replica, no communication of parameters (gradients are still summed over ranks
    by the trainer when more than one process runs)."""

    name = "none"

    def apply(self, model: torch.nn.Module, plan: ParallelPlan, dist: DistEnv) -> torch.nn.Module:
        if dist.world_size > 1:
            from ..errors import ConfigError

            raise ConfigError(
                [
                    (
                        "$.parallel.strategy",
                        "'none' runs one process; use 'ddp' or 'fsdp2' with "
                        f"{dist.world_size} ranks",
                    )
                ]
            )
        return model


class DDP(ParallelStrategy):
    """``torch.nn.parallel.DistributedDataParallel``: full replicas, all-reduced gradients."""

    name = "ddp"

    def apply(self, model: torch.nn.Module, plan: ParallelPlan, dist: DistEnv) -> torch.nn.Module:
        if dist.world_size == 1:
            return model
        from torch.nn.parallel import DistributedDataParallel

        device_ids = [dist.device.index] if dist.device.type == "cuda" else None
        return DistributedDataParallel(
            model,
            device_ids=device_ids,
            find_unused_parameters=False,
            broadcast_buffers=False,
        )

    def no_sync(self, model: torch.nn.Module, last_micro_step: bool) -> Any:
        if last_micro_step or not hasattr(model, "no_sync"):
            return contextlib.nullcontext()
        return model.no_sync()
