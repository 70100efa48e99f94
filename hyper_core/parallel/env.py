"""The distributed environment of a run: ranks, device, device mesh."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

import attrs

if TYPE_CHECKING:
    import torch


@attrs.define(kw_only=True)
class DistEnv:
    """Where this process sits in the job. A single process has ``world_size == 1``."""

    rank: int = 0
    local_rank: int = 0
    world_size: int = 1
    device: Any = None  # torch.device
    backend: str | None = None
    #: DeviceMesh with dims ("dp_replicate", "dp_shard"), or None for one process. FSDP2
    #: shards over "dp_shard" (which includes the ``cp`` ranks).
    mesh: Any = None
    dp_replicate: int = 1
    dp_shard: int = 1
    #: Expert-parallel degree (``[parallel] ep``): consecutive groups of ``ep`` ranks share
    #: out the routed experts of every MoE block (:mod:`hyper_core.parallel.expert_parallel`).
    ep: int = 1
    #: With ``ep > 1``: the 1-D mesh of this rank's expert-parallel group ("ep") and the mesh
    #: FSDP2 shards expert weights over: ("efsdp",) or ("dp_replicate", "efsdp"), the ranks
    #: holding the same experts. :attr:`mesh` stays the data-parallel mesh of the other weights.
    ep_mesh: Any = None
    expert_mesh: Any = None
    #: Context-parallel degree (``[parallel] cp``): consecutive groups of ``cp`` ranks split
    #: each packed row's tokens (:mod:`hyper_core.parallel.context_parallel`) and read the
    #: same data; :attr:`mesh`'s "dp_shard" dim then spans ``dp_shard × cp`` ranks.
    cp: int = 1
    #: With ``cp > 1``: the 1-D mesh of this rank's context-parallel group ("cp").
    cp_mesh: Any = None

    @property
    def is_main(self) -> bool:
        """Rank 0: prints progress and writes metrics."""
        return self.rank == 0

    @property
    def is_distributed(self) -> bool:
        """Whether a process group is initialised."""
        import torch.distributed as dist

        return dist.is_available() and dist.is_initialized()

    @property
    def dp_size(self) -> int:
        """Data-parallel degree: the number of different data shards (the ``cp`` ranks of a
        group read the same one)."""
        return self.world_size // self.cp

    @property
    def dp_rank(self) -> int:
        """This rank's data shard (its context-parallel group's index)."""
        return self.rank // self.cp

    @property
    def cp_rank(self) -> int:
        """This rank's place in its context-parallel group."""
        return self.rank % self.cp

    def data_view(self) -> DistEnv:
        """This environment as the data sees it: one rank per data shard (``rank =
        dp_rank``, ``world_size = dp_size``), for sharding samples only, never for
        collectives. ``self`` when every rank reads its own shard (``cp == 1``)."""
        if self.cp == 1:
            return self
        return attrs.evolve(self, rank=self.dp_rank, world_size=self.dp_size, cp=1, cp_mesh=None)

    def all_reduce_sum(self, value: torch.Tensor) -> torch.Tensor:
        """Sum a tensor over all ranks (in place; identity for one process)."""
        if self.world_size > 1:
            import torch.distributed as dist

            dist.all_reduce(value, op=dist.ReduceOp.SUM)
        return value

    def all_reduce_max(self, value: torch.Tensor) -> torch.Tensor:
        """Element-wise maximum of a tensor over all ranks (in place; identity for one
        process)."""
        if self.world_size > 1:
            import torch.distributed as dist

            dist.all_reduce(value, op=dist.ReduceOp.MAX)
        return value

    def max_int(self, value: int) -> int:
        """The largest of every rank's ``value`` (a collective when distributed).

        Host values go through a CPU tensor, so the CPU backend carries them (gloo: an NCCL
        job's process group is ``cuda:nccl,cpu:gloo``) and the host never waits for the
        device's queue to drain, as ``.item()`` on a device tensor would."""
        if self.world_size == 1:
            return value
        import torch

        t = torch.tensor([value], dtype=torch.int64)
        return int(self.all_reduce_max(t).item())

    def sum_float(self, value: float) -> float:
        """The sum of every rank's ``value``, on the host like :meth:`max_int`."""
        if self.world_size == 1:
            return value
        import torch

        t = torch.tensor([value], dtype=torch.float64)
        return float(self.all_reduce_sum(t).item())

    def any_true(self, flag: bool) -> bool:
        """Whether ``flag`` is true on any rank (a collective when distributed)."""
        return bool(self.max_int(1 if flag else 0))

    def barrier(self) -> None:
        """Wait for every rank."""
        if self.world_size > 1:
            import torch.distributed as dist

            dist.barrier()


def torchrun_env() -> dict[str, int] | None:
    """RANK/LOCAL_RANK/WORLD_SIZE when launched by torchrun, else None."""
    if "RANK" not in os.environ or "WORLD_SIZE" not in os.environ:
        return None
    return {
        "rank": int(os.environ["RANK"]),
        "local_rank": int(os.environ.get("LOCAL_RANK", "0")),
        "world_size": int(os.environ["WORLD_SIZE"]),
    }
