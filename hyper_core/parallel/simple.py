"""The ``none`` and ``ddp`` strategies."""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Any

from ..errors import ConfigError
from .base import ParallelStrategy

if TYPE_CHECKING:
    import torch

    from ..adapters.base import ParallelPlan
    from .env import DistEnv


class NoParallel(ParallelStrategy):
    """One process, no communication."""

    name = "none"

    def apply(self, model: torch.nn.Module, plan: ParallelPlan, dist: DistEnv) -> torch.nn.Module:
        if dist.world_size > 1:
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
    """``torch.nn.parallel.DistributedDataParallel``: full replicas, averaged gradients.

    Rank 0's weights reach the other ranks through DDP's own start-up broadcast of parameters
    and buffers (the other ranks only allocate storage for their meta model). ``[parallel]
    reduce_dtype = "bfloat16"``/``"float16"`` compresses the gradient all-reduce (a DDP comm
    hook); ``param_dtype`` is FSDP2's: with DDP use ``[training] mixed_precision``.
    """

    name = "ddp"
    meta_init = True

    def apply(self, model: torch.nn.Module, plan: ParallelPlan, dist: DistEnv) -> torch.nn.Module:
        if self.parallel.param_dtype is not None:
            raise ConfigError(
                [
                    (
                        "$.parallel.param_dtype",
                        "only fsdp2 casts parameters; with ddp use [training] "
                        'mixed_precision = "bf16"',
                    )
                ]
            )
        if dist.world_size == 1:
            return model
        from torch.nn.parallel import DistributedDataParallel

        from .materialize import materialize, move_to

        if dist.rank == 0:
            move_to(model, dist.device)
        else:
            materialize(model, dist.device)
        device_ids = [dist.device.index] if dist.device.type == "cuda" else None
        ddp = DistributedDataParallel(
            model,
            device_ids=device_ids,
            init_sync=True,  # broadcasts rank 0's parameters and buffers
            forward_sync_buffers=False,
            find_unused_parameters=False,
        )
        reduce = self.parallel.reduce_dtype
        if reduce in ("bfloat16", "float16"):
            from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

            hook = (
                default_hooks.bf16_compress_hook
                if reduce == "bfloat16"
                else default_hooks.fp16_compress_hook
            )
            ddp.register_comm_hook(None, hook)
        return ddp

    def no_sync(self, model: torch.nn.Module, last_micro_step: bool) -> Any:
        if last_micro_step or not hasattr(model, "no_sync"):
            return contextlib.nullcontext()
        return model.no_sync()
