"""Regional ``torch.compile`` (``[training] compile = true``): each sharding unit (decoder
layer, vision block) compiled on its own, as torchtitan does, not the whole model.

Units are compiled with dynamic shapes, so the varying lengths of packed rows reuse one graph
instead of recompiling per length; :func:`compile_counts` reports how many graphs and
recompiles there were. Applied after activation checkpointing and before the strategy
shards the model. State-dict keys do not change (``nn.Module.compile`` compiles in place).
"""

from __future__ import annotations

from typing import Any

from ..adapters.hf import match_modules


def apply_regional_compile(model: Any, plan: Any) -> list[str]:
    """Compile every sharding unit of ``plan`` in place; returns their names."""
    names = match_modules(model, plan.sharding_units)
    for name in names:
        model.get_submodule(name).compile(dynamic=True)
    return names


def compile_counts() -> dict[str, int]:
    """Graphs compiled and recompiles so far in this process (torch's dynamo counters)."""
    from torch._dynamo.utils import counters

    return {
        "graphs": int(counters["stats"].get("unique_graphs", 0)),
        "recompiles": int(sum(counters["recompiles"].values())),
    }
