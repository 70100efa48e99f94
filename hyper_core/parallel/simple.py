"""The ``none`` and ``ddp`` strategies."""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Any

from ..errors import ConfigError
from .base import ParallelStrategy

if TYPE_CHECKING:
    from collections.abc import Callable

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

    Weights from ``[model] path`` (``plan.load.sharded_load``): every rank reads the whole
    checkpoint itself (the ``parallelize_model`` stage's per-rank load, which gives each rank
    the same values), so no rank waits for rank 0 and none holds the model twice; DDP wraps the
    model once its weights are in, without a broadcast (:meth:`_wrap_after_load`). A random
    init reaches the other ranks through DDP's start-up broadcast of rank 0's parameters and
    buffers (the other ranks only allocate storage for their meta model). ``[parallel]
    reduce_dtype = "bfloat16"``/``"float16"`` compresses the gradient all-reduce (a DDP comm
    hook); ``param_dtype`` is FSDP2's: with DDP use ``[training] mixed_precision``.
    """

    name = "ddp"
    meta_init = True
    loads_shards = True  # its "shard" is the whole model

    def __init__(self, parallel_config: Any, training_config: Any) -> None:
        super().__init__(parallel_config, training_config)
        #: Sets up the DDP wrapper :meth:`_wrap_after_load` returned, once; None when done.
        self._pending: Callable[[], None] | None = None

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

        if plan.load is not None and plan.load.sharded_load:
            return self._wrap_after_load(model, dist)
        if dist.rank == 0:
            move_to(model, dist.device)
        else:
            materialize(model, dist.device)
        ddp = DistributedDataParallel.__new__(DistributedDataParallel)
        self._init_ddp(ddp, model, dist, init_sync=True)  # broadcasts rank 0's weights
        return ddp

    def _init_ddp(self, ddp: Any, model: torch.nn.Module, dist: DistEnv, init_sync: bool) -> None:
        """Set up ``ddp`` (a ``DistributedDataParallel`` not yet initialised) around
        ``model``, with the ``reduce_dtype`` comm hook."""
        from torch.nn.parallel import DistributedDataParallel

        device_ids = [dist.device.index] if dist.device.type == "cuda" else None
        DistributedDataParallel.__init__(
            ddp,
            model,
            device_ids=device_ids,
            init_sync=init_sync,
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

    def no_sync(self, model: torch.nn.Module, last_micro_step: bool) -> Any:
        self._finish_pending()
        if last_micro_step or not hasattr(model, "no_sync"):
            return contextlib.nullcontext()
        return model.no_sync()

    def weights_loaded(self, model: torch.nn.Module) -> None:
        """Set DDP up now, unless a plugin still has parameters on meta to initialise after
        the stage (LoRA): then at the first forward (or ``no_sync``)."""
        if not any(p.is_meta for p in self.unwrap(model).parameters()):
            self._finish_pending()

    def _finish_pending(self) -> None:
        if self._pending is not None:
            self._pending()

    def _wrap_after_load(self, model: torch.nn.Module, dist: DistEnv) -> torch.nn.Module:
        """A ``DistributedDataParallel`` around the meta ``model``, set up once the weights
        are in (:meth:`weights_loaded`).

        Its buffers are allocated here (non-persistent ones recomputed); the
        ``parallelize_model`` stage then fills the parameters from ``[model] path`` on every
        rank (:func:`~hyper_core.parallel.hf_load.load_hf_shards` on ``.module``). DDP is set up
        then, without broadcasting (every rank read the same files).
        """
        import torch
        from torch.nn.parallel import DistributedDataParallel

        from .materialize import materialize_buffers

        materialize_buffers(model, dist.device)
        ddp = DistributedDataParallel.__new__(DistributedDataParallel)
        torch.nn.Module.__init__(ddp)
        ddp.module = model  # what strategy.unwrap and the load see until DDP is set up

        def finish() -> None:
            meta = [name for name, p in model.named_parameters() if p.is_meta]
            if meta:
                raise RuntimeError(f"ddp: {meta[0]} has no value when DDP wraps the model")
            hook.remove()
            self._pending = None
            self._init_ddp(ddp, model, dist, init_sync=False)

        hook = ddp.register_forward_pre_hook(lambda module, args: self._finish_pending())
        self._pending = finish
        return ddp
