"""The parallel strategy extension point."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

if TYPE_CHECKING:
    import torch

    from ..adapters.base import ParallelPlan
    from .env import DistEnv


class ParallelStrategy:
    """Applies a parallelism to a model. Registered with ``register_parallel_strategies``.

    Constructed as ``Strategy(parallel_config, training_config)``; :meth:`apply` returns the
    model to train. Strategies that shard parameters set :attr:`shards_parameters` (their
    gradients are DTensors; the trainer's clipping reduces the norm over shards).

    With :attr:`meta_init` and more than one rank, ``build_model`` gives rank 0 the full model
    on the CPU and the other ranks a meta-device model; :meth:`apply` must then materialise it
    on every rank from rank 0 (see :mod:`hyper_core.parallel.materialize`).

    With :attr:`loads_shards` and weights from ``[model] path``, every rank builds on meta
    (``plan.load.sharded_load``, :class:`~hyper_core.parallel.load_plan.LoadPlan`): :meth:`apply`
    then only shards and allocates the model, the ``parallelize_model`` stage fills each rank's
    shards from the checkpoint files (:mod:`hyper_core.parallel.hf_load`) and then calls
    :meth:`weights_loaded`; no process holds the full model.

    Gradient scale: the trainer's loss is this rank's token-loss sum over the *global* number
    of loss tokens, and it multiplies it by the world size before ``backward``, so a strategy
    must *average* gradients over all ranks (what DDP and FSDP2 do by default; with
    ``[parallel] cp`` a rank's loss is a partial sum of its group's rows, so the average over
    every rank is still right).
    """

    name: ClassVar[str] = ""
    shards_parameters: ClassVar[bool] = False
    meta_init: ClassVar[bool] = False
    loads_shards: ClassVar[bool] = False
    #: Whether :meth:`apply` shares out ``plan.moe_blocks`` over ``dist.ep`` ranks
    #: (``[parallel] ep``; :mod:`hyper_core.parallel.expert_parallel`).
    expert_parallel: ClassVar[bool] = False
    #: Whether :meth:`apply` installs context parallelism (``[parallel] cp``;
    #: :mod:`hyper_core.parallel.context_parallel`), splitting each row over ``dist.cp`` ranks.
    context_parallel: ClassVar[bool] = False

    def __init__(self, parallel_config: Any, training_config: Any) -> None:
        self.parallel = parallel_config
        self.training = training_config

    def apply(self, model: torch.nn.Module, plan: ParallelPlan, dist: DistEnv) -> torch.nn.Module:
        """Return the parallelised model."""
        raise NotImplementedError

    def weights_loaded(self, model: torch.nn.Module) -> None:
        """Called with :meth:`apply`'s result once a sharded load has filled it (parameters a
        plugin's checkpoint view hid may still be on meta)."""

    def unwrap(self, model: torch.nn.Module) -> torch.nn.Module:
        """The underlying module (for state dicts, export and FLOPs)."""
        return getattr(model, "module", model)

    def no_sync(self, model: torch.nn.Module, last_micro_step: bool) -> Any:
        """Context for a micro-step's backward (DDP skips the all-reduce until the last)."""
        import contextlib

        return contextlib.nullcontext()
