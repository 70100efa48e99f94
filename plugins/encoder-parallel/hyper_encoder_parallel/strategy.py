"""The ``encoder_parallel`` strategy: a base strategy (``[encoder_parallel] base``) with
vision-encoder balancing on.

The trainer constructs strategies from ``[parallel]`` and ``[training]`` only, so the run's
:class:`~hyper_encoder_parallel.run.EncoderParallelRun` binds the base strategy once the
registries and the config are at hand (``on_stage_end`` of ``build_model``, before
``parallelize_model``); every call then goes to the base. The balancing itself is installed by
that object's ``parallelize_model`` wrapper, as with ``enabled = true``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from hyper_core.parallel.base import ParallelStrategy

if TYPE_CHECKING:
    import torch

    from hyper_core.adapters.base import ParallelPlan
    from hyper_core.parallel.env import DistEnv


class EncoderParallel(ParallelStrategy):
    """Delegates to its base strategy (``ddp``, ``fsdp2``, ...) once bound."""

    name = "encoder_parallel"
    # Both real bases (ddp, fsdp2) build on meta and materialise from rank 0; with one rank
    # the trainer ignores it. A base without meta init is refused at bind time.
    meta_init = True

    def __init__(self, parallel_config: Any, training_config: Any) -> None:
        super().__init__(parallel_config, training_config)
        self.base: ParallelStrategy | None = None

    def bind(self, base: ParallelStrategy) -> None:
        """Use ``base`` for everything (called by the plugin before ``parallelize_model``)."""
        self.base = base
        self.shards_parameters = base.shards_parameters  # type: ignore[misc]

    def _base(self) -> ParallelStrategy:
        if self.base is None:
            raise RuntimeError(
                "the encoder_parallel strategy was not bound to its base strategy; is the "
                "hyper-train-encoder-parallel plugin loaded in this process?"
            )
        return self.base

    def apply(self, model: torch.nn.Module, plan: ParallelPlan, dist: DistEnv) -> torch.nn.Module:
        return self._base().apply(model, plan, dist)

    def weights_loaded(self, model: torch.nn.Module) -> None:
        self._base().weights_loaded(model)

    def unwrap(self, model: torch.nn.Module) -> torch.nn.Module:
        return super().unwrap(model) if self.base is None else self.base.unwrap(model)

    def no_sync(self, model: torch.nn.Module, last_micro_step: bool) -> Any:
        return self._base().no_sync(model, last_micro_step)
