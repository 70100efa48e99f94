"""Where the reference log-probs of DPO come from: the policy with its adapters off, a frozen
copy, or a file written by one pass before training."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

#: Under ``output_dir``: the precomputed reference log-probs (``reference = "precompute"``).
PRECOMPUTED_FILE = Path("preference") / "reference_logps.pt"


@contextlib.contextmanager
def adapters_disabled(model: torch.nn.Module) -> Iterator[None]:
    """The model's peft layers (LoRA, DoRA, ``modules_to_save``) pass through to their base.

    Sets peft's ``_disable_adapters`` flag, which the layers' forwards read, and restores it;
    peft's own ``enable_adapters(False)`` would also flip ``requires_grad`` of the adapters,
    which a sharded model must not see change between forwards.
    """
    layers = [m for m in model.modules() if hasattr(m, "_disable_adapters")]
    if not layers:
        raise RuntimeError("reference = 'adapters_off' needs a model with peft adapters")
    before = [m._disable_adapters for m in layers]
    for m in layers:
        m._disable_adapters = True
    try:
        yield
    finally:
        for m, value in zip(layers, before, strict=True):
            m._disable_adapters = value


def save_precomputed(path: Path, table: dict[str, tuple[float, float]]) -> None:
    """Write ``pair key -> (chosen, rejected)`` log-probs (atomically: a killed pass leaves no
    file)."""
    import torch

    keys = sorted(table)
    values = torch.tensor([table[k] for k in keys], dtype=torch.float32).reshape(-1, 2)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    torch.save({"keys": keys, "logps": values}, tmp)
    tmp.replace(path)


def load_precomputed(path: Path) -> dict[str, tuple[float, float]]:
    """What :func:`save_precomputed` wrote."""
    import torch

    data = torch.load(path, weights_only=True)
    rows = data["logps"].tolist()
    return {key: (row[0], row[1]) for key, row in zip(data["keys"], rows, strict=True)}


def meta_copy(model: torch.nn.Module) -> torch.nn.Module:
    """A frozen copy of ``model``'s structure on meta (no storage), for a sharded reference."""
    import copy

    import torch

    memo: dict[int, object] = {}
    for p in model.parameters():
        memo[id(p)] = torch.nn.Parameter(p.new_empty(p.shape, device="meta"), requires_grad=False)
    for b in model.buffers():
        memo[id(b)] = b.new_empty(b.shape, device="meta")
    return copy.deepcopy(model, memo)


def shard_like(
    reference: torch.nn.Module, policy: torch.nn.Module, plan: Any, dist: Any, mp_policy: Any
) -> None:
    """Shard ``reference`` (on meta, the policy's structure) as fsdp2 sharded the policy (the
    same units, mesh and mixed precision) and give it the policy's current shards: a frozen
    copy of the starting weights at one model's memory per rank more, divided by the ranks."""
    import torch
    from torch.distributed.fsdp import fully_shard

    from hyper_core.parallel.materialize import materialize

    for name in reversed(plan.match(reference)):
        fully_shard(reference.get_submodule(name), mesh=dist.mesh, mp_policy=mp_policy)
    fully_shard(reference, mesh=dist.mesh, mp_policy=mp_policy)
    materialize(reference, dist.device)
    sources = dict(policy.named_parameters())
    buffers = dict(policy.named_buffers())
    with torch.no_grad():
        for name, p in reference.named_parameters():
            local = p.to_local() if hasattr(p, "to_local") else p
            source = sources[name]
            local.copy_(source.to_local() if hasattr(source, "to_local") else source)
        for name, b in reference.named_buffers():
            b.copy_(buffers[name])
