"""The ``fsdp2`` strategy: ``fully_shard`` per sharding unit on the data-parallel mesh.

With ``[parallel] dp_replicate > 1`` the mesh is 2-D (``dp_replicate × dp_shard``) and FSDP2
shards within a replica group and all-reduces across groups (HSDP). The model arrives on meta
(rank 0 keeps the full weights aside), is sharded, allocated shard-wise on the device and
filled from rank 0 (:mod:`hyper_core.parallel.materialize`). With ``[model] path`` no rank
holds the full weights: every rank builds on meta and, after sharding, reads its own slices
of the checkpoint (:mod:`hyper_core.parallel.hf_load`).

Gradients: FSDP2 divides the reduce-scattered (and, under HSDP, all-reduced) gradients by the
world size of its mesh, i.e. it averages, which the trainer's ``× world_size`` loss scale turns
into the sum the global-token normalisation needs (with ``[parallel] cp`` the mesh includes
the context-parallel ranks, whose partial losses must add up too:
:mod:`hyper_core.parallel.context_parallel`).
"""

from __future__ import annotations

import logging
import re
import warnings
from typing import TYPE_CHECKING

from ..adapters.hf import torch_dtype
from .base import ParallelStrategy

if TYPE_CHECKING:
    import torch

    from ..adapters.base import ParallelPlan
    from .env import DistEnv

log = logging.getLogger("hyper_train")


class FSDP2(ParallelStrategy):
    """Fully sharded data parallelism (``torch.distributed.fsdp.fully_shard``)."""

    name = "fsdp2"
    shards_parameters = True
    meta_init = True
    loads_shards = True
    expert_parallel = True
    context_parallel = True

    def mixed_precision(self) -> object:
        """The ``MixedPrecisionPolicy`` of ``[parallel] param_dtype``/``reduce_dtype``; unset
        under ``[training] mixed_precision = "bf16"``: bf16 gather, fp32 reduction (the
        parameters stay in the weights' dtype, fp32 master weights by default)."""
        from torch.distributed.fsdp import MixedPrecisionPolicy

        from ..step.precision import fsdp_precision

        mp = fsdp_precision(self.parallel, self.training)
        return MixedPrecisionPolicy(
            param_dtype=torch_dtype(mp.param_dtype), reduce_dtype=torch_dtype(mp.reduce_dtype)
        )

    def apply(self, model: torch.nn.Module, plan: ParallelPlan, dist: DistEnv) -> torch.nn.Module:
        from torch.distributed.fsdp import fully_shard

        from .materialize import (
            load_from_rank0,
            materialize,
            materialize_buffers,
            take_rank0_source,
        )

        mesh = dist.mesh
        if mesh is None:
            if dist.world_size > 1:
                raise RuntimeError("fsdp2 needs the device mesh of setup_distributed")
            # One process: the same wrapping on a 1-rank mesh, so the step computes in the
            # same dtypes as on N ranks (bf16 parameters under the mixed-precision policy);
            # FSDP2 skips the collectives of a 1-rank group and only casts.
            from .setup import single_process_mesh

            mesh = single_process_mesh(dist.device)
        # A single process has its model built in full on its device: nothing to fill.
        # Weights from [model] path: every rank is on meta and reads its own shards after this.
        load = plan.load
        sharded_load = load is not None and load.sharded_load
        # Rank 0 holds the weights the other ranks (on meta) are filled from.
        from_rank0 = not sharded_load and (load.meta_init if load else dist.world_size > 1)
        source = take_rank0_source(model, dist) if from_rank0 else None
        mp = self.mixed_precision()
        units = plan.match(model)
        if not units and dist.is_main:
            log.warning(
                "fsdp2: no module matches the sharding units %s; the model is one FSDP unit",
                ", ".join(plan.sharding_units) or "(none)",
            )
        if plan.moe_blocks and dist.ep > 1:
            from .expert_parallel import shard_experts

            shard_experts(model, list(plan.moe_blocks), dist, mp)
        if dist.cp > 1:
            from .context_parallel import install_context_parallel

            install_context_parallel(model, dist, plan.context_parallel)
            grid = plan.context_parallel and plan.context_parallel.vision_grid_keyword()
            if plan.vision_encoder is not None and grid:
                from .cp_vision import split_vision_tower

                split_vision_tower(model, plan.vision_encoder.module, dist, grid)
        # Innermost first: a unit nested in another must be sharded before its parent.
        for name in reversed(units):
            fully_shard(model.get_submodule(name), mesh=mesh, mp_policy=mp)
        fully_shard(model, mesh=mesh, mp_policy=mp)
        ignore_root_view_warning(model)
        if sharded_load:
            # Parameters stay on meta: the load creates each rank's shards (FSDP2 adopts the
            # new parameters at its lazy init), so no second copy is ever allocated.
            materialize_buffers(model, dist.device)
        elif from_rank0:
            materialize(model, dist.device)
            load_from_rank0(model, source, dist)
        return model

    def unwrap(self, model: torch.nn.Module) -> torch.nn.Module:
        return model


def ignore_root_view_warning(model: torch.nn.Module) -> None:
    """Silence FSDP2's "returned a view tensor ... can produce wrong gradients" warning for
    the root module only.

    It warns (once per step's forward) because an in-place op on a returned view would drop
    the pre-backward hook and so the all-gather of the root's parameters. It does not apply
    to the root: its outputs go only to the loss function, which reads them out of place
    (``causal_lm_loss``: ``logits.float()``); the views are outputs nothing reads, e.g.
    a VL model's ``image_outputs.pooler_output`` (a ``torch.split`` of the image embeddings).
    Sharding units inside the model keep the warning: there an in-place op by the parent
    module would be real.
    """
    name = re.escape(type(model).__name__)
    warnings.filterwarnings(
        "ignore", message=rf"FSDP2-wrapped module \({name}\) returned a view tensor"
    )
