"""Process group, device mesh and seeding for the default ``setup_distributed`` stage."""

from __future__ import annotations

import datetime
import os
import random
from typing import Any

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
    """Join the torchrun job (if any) and build the ``dp_replicate × dp_shard`` mesh."""
    import torch
    import torch.distributed as dist

    seed_everything(config.run.seed, config.run.deterministic)
    env = torchrun_env()
    cuda = torch.cuda.is_available()
    if env is None or env["world_size"] == 1:
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
    replicate = par.dp_replicate
    shard = par.dp_shard if par.dp_shard != -1 else world // replicate
    if replicate * shard != world:
        raise ConfigError(
            [
                (
                    "$.parallel",
                    f"dp_replicate ({replicate}) × dp_shard ({shard}) must equal the "
                    f"world size ({world})",
                )
            ]
        )
    if shard % par.ep:
        raise ConfigError([("$.parallel.ep", f"{par.ep} does not divide dp_shard ({shard})")])
    if par.ep > 1:
        mesh, ep_mesh, expert_mesh = expert_parallel_meshes(device.type, replicate, shard, par.ep)
    else:
        mesh, ep_mesh, expert_mesh = data_parallel_mesh(device.type, replicate, shard), None, None
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
    )


def data_parallel_mesh(device_type: str, replicate: int, shard: int) -> Any:
    """The ``(dp_replicate, dp_shard)`` mesh, or ``(dp_shard,)`` without replicas."""
    from torch.distributed.device_mesh import init_device_mesh

    if replicate > 1:
        return init_device_mesh(
            device_type, (replicate, shard), mesh_dim_names=("dp_replicate", "dp_shard")
        )
    return init_device_mesh(device_type, (shard,), mesh_dim_names=("dp_shard",))


def expert_parallel_meshes(device_type: str, replicate: int, shard: int, ep: int) -> tuple:
    """``(data-parallel mesh, ep mesh, expert FSDP mesh)``: the data-parallel mesh with
    ``dp_shard`` unflattened into ``(efsdp, ep)``, so the ``ep`` ranks of a group are
    consecutive (one node when ``ep`` ≤ GPUs per node) and FSDP2 composes the expert shards
    (DTensors on "ep") with its own over "efsdp" (and "dp_replicate")."""
    mesh = data_parallel_mesh(device_type, replicate, shard)
    experts = mesh._unflatten("dp_shard", (shard // ep, ep), ("efsdp", "ep"))
    if replicate > 1:
        return mesh, experts["ep"], experts["dp_replicate", "efsdp"]
    return mesh, experts["ep"], experts["efsdp"]
