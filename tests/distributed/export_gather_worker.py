"""Rank process of ``test_export_gather``: gathers DTensors for an export (rows sharded over 4
ranks unevenly, HSDP's 2×2 mesh, a column shard) and records, per rank, what it got back,
its ``full_tensor`` calls and its gathers."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import torch
import torch.distributed as tdist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_tensor

from hyper_core.export import _gathered_groups, group_keys


def main(out: Path) -> None:
    tdist.init_process_group("gloo")
    rank = tdist.get_rank()
    torch.manual_seed(0)  # the same full tensors on every rank
    full = {
        "layers.0.w": torch.randn(5, 3),  # 4 ranks: rows 2, 2, 1, 0
        "layers.0.b": torch.randn(1),  # one row: ranks 1-3 hold none
        "hsdp.w": torch.randn(6, 2),
        "cols.w": torch.randn(3, 8),  # Shard(1): the all-gather fallback
    }
    flat = init_device_mesh("cpu", (4,))
    hsdp = init_device_mesh("cpu", (2, 2), mesh_dim_names=("replicate", "shard"))
    layouts = {
        "layers.0.w": (flat, [Shard(0)]),
        "layers.0.b": (flat, [Shard(0)]),
        "hsdp.w": (hsdp, [Replicate(), Shard(0)]),
        "cols.w": (flat, [Shard(1)]),
    }
    state = {k: distribute_tensor(full[k], *layouts[k]) for k in full}

    calls: dict[str, list[Any]] = {"full_tensor": [], "gather": []}
    full_tensor, gather = DTensor.full_tensor, tdist.gather

    def recording_full_tensor(self: DTensor, **kwargs: Any) -> torch.Tensor:
        calls["full_tensor"].append(list(self.shape))
        return full_tensor(self, **kwargs)

    def recording_gather(tensor: torch.Tensor, gather_list: Any = None, **kwargs: Any) -> Any:
        calls["gather"].append([list(tensor.shape), gather_list is not None])
        return gather(tensor, gather_list, **kwargs)

    DTensor.full_tensor = recording_full_tensor  # type: ignore[method-assign]
    tdist.gather = recording_gather
    got: dict[str, torch.Tensor] = {}
    for group in _gathered_groups(state, group_keys(state), keep=rank == 0):
        got.update(group)
    record = {
        "keys": sorted(got),
        "exact": all(torch.equal(got[k], full[k]) for k in got),
        "devices": sorted({str(t.device) for t in got.values()}),
        **calls,
    }
    (out / f"rank{rank}.json").write_text(json.dumps(record))
    tdist.barrier()
    tdist.destroy_process_group()


if __name__ == "__main__":
    from hyper_core.parallel.exit import exit_rank

    main(Path(sys.argv[1]))
    exit_rank(0)  # no interpreter finalisation: see hyper_core.parallel.exit
