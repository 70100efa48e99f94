"""Process group, device mesh and seeding for the default ``setup_distributed`` stage."""

from __future__ import annotations

import datetime
import os
import random
from typing import Any

from ..config.world import context_parallel_problem
from ..errors import ConfigError
from .env import DistEnv, torchrun_env


def seed_everything(seed: int, deterministic: bool) -> None:
    """Seed python, numpy and torch; optionally make torch deterministic."""
    import numpy as np
    import torch

    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)
    if deterministic:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.use_deterministic_algorithms(True, warn_only=True)


def use_tf32(enabled: bool) -> None:
    """Let fp32 matmuls and convolutions on CUDA use TF32 tensor cores (``[training] tf32``)."""
    import torch

    torch.set_float32_matmul_precision("high" if enabled else "highest")
    torch.backends.cudnn.allow_tf32 = enabled


def init_distributed(config: Any) -> DistEnv:
    """Join the torchrun job (if any) and build the ``dp_replicate × dp_shard`` mesh (with
    ``[parallel] cp``, "dp_shard" spans ``dp_shard × cp`` ranks)."""
    import torch
    import torch.distributed as dist

    seed_everything(config.run.seed, config.run.deterministic)
    env = torchrun_env()
    cuda = torch.cuda.is_available()
    if env is None or env["world_size"] == 1:
        if config.parallel.cp > 1:
            cp = config.parallel.cp
            raise ConfigError(
                [("$.parallel.cp", f"{cp} needs {cp} ranks or a multiple (torchrun), got 1")]
            )
        device = torch.device("cuda", 0) if cuda else torch.device("cpu")
        if cuda:
            torch.cuda.set_device(device)
            use_tf32(config.training.tf32)
        return DistEnv(device=device)
    rank, local_rank, world = env["rank"], env["local_rank"], env["world_size"]
    par = config.parallel
    backend = par.backend if par.backend != "auto" else ("nccl" if cuda else "gloo")
    device = torch.device("cuda", local_rank) if backend == "nccl" else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
        use_tf32(config.training.tf32)
    if not dist.is_initialized():
        # NCCL jobs also get a gloo backend for CPU tensors (DCP's async save needs one).
        dist.init_process_group(
            backend="cuda:nccl,cpu:gloo" if backend == "nccl" else backend,
            timeout=datetime.timedelta(seconds=par.timeout_s),
            device_id=device if device.type == "cuda" else None,
        )
    replicate, cp = par.dp_replicate, par.cp
    problem = context_parallel_problem(config, None)  # the strategy: in the trainer
    if problem is not None:
        raise ConfigError([problem])
    shard = par.dp_shard if par.dp_shard != -1 else world // (replicate * cp)
    if replicate * shard * cp != world:
        raise ConfigError(
            [
                (
                    "$.parallel.cp" if cp > 1 else "$.parallel",
                    f"dp_replicate ({replicate}) × dp_shard ({shard})"
                    + (f" × cp ({cp})" if cp > 1 else "")
                    + f" must equal the world size ({world})",
                )
            ]
        )
    if (shard * cp) % par.ep:
        raise ConfigError(
            [
                (
                    "$.parallel.ep",
                    f"{par.ep} does not divide dp_shard ({shard})"
                    + (f" × cp ({cp}) = {shard * cp}" if cp > 1 else ""),
                )
            ]
        )
    mesh = data_parallel_mesh(device.type, replicate, shard * cp)
    cp_mesh = ep_mesh = expert_mesh = None
    if par.ep > 1:
        ep_mesh, expert_mesh = expert_parallel_meshes(mesh, replicate, par.ep)
    if cp > 1:
        cp_mesh = context_parallel_mesh(mesh, cp)
    return DistEnv(
        rank=rank,
        local_rank=local_rank,
        world_size=world,
        device=device,
        backend=backend,
        mesh=mesh,
        dp_replicate=replicate,
        dp_shard=shard,
        ep=par.ep,
        ep_mesh=ep_mesh,
        expert_mesh=expert_mesh,
        cp=cp,
        cp_mesh=cp_mesh,
    )


def single_process_mesh(device: Any) -> Any:
    """A 1-rank ``("dp_shard",)`` mesh for a process outside torchrun, with the 1-rank process
    group it needs (joined if one exists). The run's end destroys the group
    (:func:`end_distributed`)."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    if not dist.is_initialized():
        cuda = device.type == "cuda"
        dist.init_process_group(
            backend="cuda:nccl,cpu:gloo" if cuda else "gloo",
            store=dist.HashStore(),
            rank=0,
            world_size=1,
            device_id=device if cuda else None,
        )
    return init_device_mesh(device.type, (1,), mesh_dim_names=("dp_shard",))


def end_distributed() -> None:
    """Destroy this process's process group, if any (a torchrun job's or a single process's
    :func:`single_process_mesh`)."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def data_parallel_mesh(device_type: str, replicate: int, shard: int) -> Any:
    """The ``(dp_replicate, dp_shard)`` mesh, or ``(dp_shard,)`` without replicas."""
    from torch.distributed.device_mesh import init_device_mesh

    if replicate > 1:
        return init_device_mesh(
            device_type, (replicate, shard), mesh_dim_names=("dp_replicate", "dp_shard")
        )
    return init_device_mesh(device_type, (shard,), mesh_dim_names=("dp_shard",))


def expert_parallel_meshes(mesh: Any, replicate: int, ep: int) -> tuple:
    """``(ep mesh, expert FSDP mesh)`` of the data-parallel ``mesh``: its "dp_shard" dim
    unflattened into ``(efsdp, ep)``, so the ``ep`` ranks of a group are consecutive (one node
    when ``ep`` ≤ GPUs per node) and FSDP2 composes the expert shards (DTensors on "ep") with
    its own over "efsdp" (and "dp_replicate"). With ``[parallel] cp``, "dp_shard" spans the
    cp ranks too: a cp group's ranks exchange tokens with their ep group like any other."""
    shard = mesh["dp_shard"].size()
    experts = mesh._unflatten("dp_shard", (shard // ep, ep), ("efsdp", "ep"))
    if replicate > 1:
        return experts["ep"], experts["dp_replicate", "efsdp"]
    return experts["ep"], experts["efsdp"]


def context_parallel_mesh(mesh: Any, cp: int) -> Any:
    """The cp mesh of the data-parallel ``mesh``, whose "dp_shard" dim spans ``dp_shard ×
    cp`` ranks: FSDP2 shards over all of them (like torchtitan's flattened ``dp_shard_cp``:
    the ranks of a cp group hold different shards of the weights and split the same rows),
    and the cp groups are its consecutive runs of ``cp`` ranks (one node when ``cp`` ≤ GPUs
    per node), the "cp" dim of "dp_shard" unflattened into ``(dp, cp)``."""
    shard = mesh["dp_shard"].size()
    return mesh._unflatten("dp_shard", (shard // cp, cp), ("dp", "cp"))["cp"]
