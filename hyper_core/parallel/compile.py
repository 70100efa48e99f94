"""Regional ``torch.compile`` (``[training] compile = true``): each sharding unit (decoder
layer, vision block) compiled on its own, as torchtitan does, not the whole model.

Units are compiled with dynamic shapes, so the varying lengths of packed rows reuse one graph
instead of recompiling per length; :func:`compile_counts` reports how many graphs and
recompiles there were. Applied after activation checkpointing and before the strategy
shards the model. State-dict keys do not change (``nn.Module.compile`` compiles in place).
"""

from __future__ import annotations

from typing import Any

import attrs


def apply_regional_compile(model: Any, plan: Any) -> list[str]:
    """Compile every sharding unit of ``plan`` in place; returns their names."""
    import torch._dynamo.config

    # Tensors a unit reaches through its submodules' attributes (not parameters or buffers)
    # get symbolic sizes like its arguments: the label rows of the last decoder layer
    # (`step.label_rows`) vary by forward, and static sizes would compile it again for each
    # row length and label count. Process-wide, like the matmul precision.
    torch._dynamo.config.force_nn_module_property_static_shapes = False
    names = plan.match(model)
    for name in names:
        model.get_submodule(name).compile(dynamic=True)
    return names


#: Keys of :func:`compile_counts` that are not dynamo frames.
_TOTALS = ("graphs", "graph_breaks")


@attrs.frozen
class CompileCounts:
    """What ``torch.compile`` did over a span of a run."""

    graphs: int
    recompiles: int
    #: Places where dynamo split a graph (each time it met one): 0 means every compiled unit
    #: is one graph, with nothing in it run by Python between its parts.
    graph_breaks: int

    def summary(self) -> str:
        """The run's end line."""
        return (
            f"torch.compile: {self.graphs} graph(s), {self.recompiles} recompile(s), "
            f"{self.graph_breaks} graph break(s)"
        )


def compile_counts() -> dict[str, int]:
    """Compiles so far in this process: per dynamo frame (``frame/compile`` ids in torch's
    logs), under ``"frame N"`` keys; the graphs made, under ``"graphs"``; the graph breaks,
    under ``"graph_breaks"``."""
    from torch._dynamo.convert_frame import FRAME_COMPILE_COUNTER
    from torch._dynamo.utils import counters

    counts = {f"frame {k}": int(v) for k, v in FRAME_COMPILE_COUNTER.items()}
    counts["graphs"] = int(counters["stats"].get("unique_graphs", 0))
    counts["graph_breaks"] = int(sum(counters["graph_break"].values()))
    return counts


def compiles_since(before: dict[str, int]) -> CompileCounts:
    """The counts since the :func:`compile_counts` snapshot ``before``: a recompile is any
    compile of a frame after its first in that span. Units of one class share a frame, so a
    model whose units differ (vision blocks and decoder layers, the last layer at label rows,
    evaluation without gradients) counts one recompile per kind; a count that grows with the
    steps means shapes are specialised."""
    now = compile_counts()
    graphs, breaks = (now.pop(key) - before.get(key, 0) for key in _TOTALS)
    per_frame = [n - before.get(frame, 0) for frame, n in now.items()]
    return CompileCounts(
        graphs=graphs, recompiles=sum(d - 1 for d in per_frame if d > 0), graph_breaks=breaks
    )
