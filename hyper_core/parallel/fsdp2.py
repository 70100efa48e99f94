"""The ``fsdp2`` strategy: ``fully_shard`` per sharding unit on the data-parallel mesh.

With ``[parallel] dp_replicate > 1`` the mesh is 2-D and FSDP2 shards within a replica group and
replicates across them (HSDP).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..adapters.hf import match_modules, torch_dtype
from .base import ParallelStrategy

if TYPE_CHECKING:
    import torch

    from ..adapters.base import ParallelPlan
    from .env import DistEnv


class FSDP2(ParallelStrategy):
    """Fully sharded data parallelism (``torch.distributed.fsdp.fully_shard``)."""

    name = "fsdp2"
    shards_parameters = True

    def apply(self, model: torch.nn.Module, plan: ParallelPlan, dist: DistEnv) -> torch.nn.Module:
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        mesh = dist.mesh
        if mesh is None:
            from torch.distributed.device_mesh import init_device_mesh

            mesh = init_device_mesh(dist.device.type, (1,), mesh_dim_names=("dp_shard",))
        if mesh.ndim == 2 and mesh.mesh_dim_names == ("dp_replicate", "dp_shard"):
            fsdp_mesh = mesh
        else:
            fsdp_mesh = mesh
        mp = MixedPrecisionPolicy(
            param_dtype=torch_dtype(self.parallel.param_dtype),
            reduce_dtype=torch_dtype(self.parallel.reduce_dtype),
        )
        for name in match_modules(model, plan.sharding_units):
            fully_shard(model.get_submodule(name), mesh=fsdp_mesh, mp_policy=mp)
        fully_shard(model, mesh=fsdp_mesh, mp_policy=mp)
        return model

    def unwrap(self, model: torch.nn.Module) -> torch.nn.Module:
        return model
