"""How a run's weights reach each rank: decided once (the ``plan_load`` stage), then handed to
``build_model`` and, through :attr:`ParallelPlan.load <hyper_core.adapters.ParallelPlan>`, to
the strategy. The plan is frozen: a plugin that needs another plan wraps ``plan_load`` and
returns an evolved copy (``attrs.evolve``) instead of changing shared objects."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any

import attrs

if TYPE_CHECKING:
    import torch

    from .base import ParallelStrategy
    from .env import DistEnv

#: ``view(model)``: a context under which ``model``'s module tree is its checkpoint's.
CheckpointView = Callable[["torch.nn.Module"], AbstractContextManager[Any]]


@attrs.frozen(kw_only=True)
class LoadPlan:
    """Where each rank builds the model and who reads ``[model] path``."""

    #: The strategy materialises the model (several ranks): rank 0 builds it in full on the
    #: CPU, the other ranks on meta (see :mod:`hyper_core.parallel.materialize`).
    meta_init: bool = False
    #: Every rank, rank 0 too, builds on meta and the ``parallelize_model`` stage reads each
    #: rank's shards of ``[model] path`` after the strategy (:mod:`hyper_core.parallel.hf_load`).
    sharded_load: bool = False
    #: With :attr:`sharded_load`: entered around the load, for a plugin whose modules differ
    #: from the checkpoint's (``hyper-train-peft`` swaps its LoRA layers for their base layers;
    #: what the view hides stays on meta for the plugin to initialise).
    checkpoint_view: CheckpointView | None = None

    @classmethod
    def for_run(
        cls, dist: DistEnv, strategy: ParallelStrategy, adapter: Any, model_config: Any
    ) -> LoadPlan:
        """The core's plan: meta init when the strategy materialises and there are several
        ranks; a sharded load when it also loads shards, weights come from ``[model] path``
        and the adapter maps checkpoint names."""
        meta_init = strategy.meta_init and dist.world_size > 1
        return cls(
            meta_init=meta_init,
            sharded_load=(
                meta_init
                and strategy.loads_shards
                and model_config.path is not None
                and hasattr(adapter, "checkpoint_conversions")
                and hasattr(adapter, "check_weights")
            ),
        )

    def build_device(self, rank: int) -> str:
        """Where rank ``rank`` builds the model: ``"cpu"`` (rank 0, or one process) or
        ``"meta"`` (the other ranks; every rank when each loads its own shards)."""
        return "meta" if self.meta_init and (rank != 0 or self.sharded_load) else "cpu"
