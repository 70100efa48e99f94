"""Routing statistics of an expert-parallel run, logged with the metrics (``[parallel] ep > 1``).

A forward hook on each MoE block's experts module adds this rank's ``(token, expert)``
assignments per expert into a device counter (``index_add_``: no host sync per step; training
forwards only, not activation checkpointing's recompute, not evaluation). At each logged step
(a collective on every rank) the counts are summed over ranks and reset, and ``on_log`` adds,
over the steps since the last log:

* ``moe/expert_load_max``, ``moe/expert_load_min``: the most and least loaded expert of any
  MoE layer, as a multiple of the mean (1.0 = balanced);
* ``moe/ep_load_max``: the most loaded ep rank (the experts it holds) of any layer, as a
  multiple of the mean: the rank the others wait for;
* ``moe/a2a_rows_per_step``: assignments sent to another rank per step, over all ranks (each
  is a row of ``hidden`` values sent there and back in forward, and again in backward);
* ``moe/expert_param_bytes``: the most bytes of routed-expert weights any rank holds.

The core registers one per run (``hyper_core.builtin.moe_stats``' ``build_callbacks``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..hookspecs import hookimpl

if TYPE_CHECKING:
    import torch


def in_backward() -> bool:
    """Whether autograd's engine is running this code (a checkpointed forward's recompute):
    statistics hooks skip it, or they would count a checkpointed layer twice."""
    import torch

    return torch._C._current_graph_task_id() != -1


class ExpertParallelStats:
    """One run's routing counters (see the module doc)."""

    def __init__(self, ep: int) -> None:
        self.ep = ep
        self.num_experts: list[int] = []
        self.counts: list[torch.Tensor | None] = []
        self.steps = 0
        self.expert_bytes = 0
        self._handles: list[Any] = []

    @hookimpl
    def on_train_begin(self, trainer: Any) -> None:
        """Hook the experts modules of the adapter's MoE blocks."""
        from torch.distributed.tensor import DTensor

        model = trainer.unwrapped_model
        for i, block in enumerate(trainer.adapter.moe_blocks(model)):
            module = model.get_submodule(block.experts)
            self.num_experts.append(block.num_experts)
            self.counts.append(None)
            self._handles.append(module.register_forward_hook(self._hook(i)))
            for p in module.parameters():
                local = p.to_local() if isinstance(p, DTensor) else p
                self.expert_bytes += local.numel() * local.element_size()

    def _hook(self, index: int) -> Any:
        def hook(module: torch.nn.Module, args: Any, output: Any) -> None:
            import torch

            if not module.training or in_backward():
                return
            with torch.no_grad():
                flat = args[1].reshape(-1)
                counts = self.counts[index]
                if counts is None:
                    counts = torch.zeros(
                        self.num_experts[index], dtype=torch.float64, device=flat.device
                    )
                    self.counts[index] = counts
                counts.index_add_(0, flat, torch.ones_like(flat, dtype=torch.float64))

        return hook

    @hookimpl
    def on_step_end(self, trainer: Any) -> None:
        self.steps += 1

    @hookimpl
    def on_log(self, trainer: Any, metrics: dict[str, Any]) -> None:
        """Add the ``moe/*`` metrics (a collective on every rank)."""
        import torch

        if not self.counts:
            return
        dist = trainer.dist
        device = dist.device if dist.device is not None else "cpu"
        rows = []
        for n, counts in zip(self.num_experts, self.counts, strict=True):
            local = counts if counts is not None else torch.zeros(n, dtype=torch.float64)
            rows.append(local.to(device))
        # Sent off-rank: the assignments to experts outside this rank's slice of its group.
        group_rank = dist.ep_mesh.get_local_rank() if dist.ep_mesh is not None else 0
        sent = sum(r.sum() - r.view(self.ep, -1)[group_rank].sum() for r in rows)
        width = max(self.num_experts)
        stacked = torch.zeros(len(rows), width + 1, dtype=torch.float64, device=device)
        for layer, r in enumerate(rows):
            stacked[layer, : r.numel()] = r
        stacked[0, -1] = sent
        extra = torch.tensor([float(self.expert_bytes)], dtype=torch.float64, device=device)
        dist.all_reduce_sum(stacked)
        dist.all_reduce_max(extra)
        table, (param_bytes,) = stacked.tolist(), extra.tolist()
        steps, a2a = max(self.steps, 1), table[0][-1]
        self.counts = [None] * len(self.counts)
        self.steps = 0
        expert_max, expert_min, ep_max = 0.0, float("inf"), 0.0
        for layer, n in enumerate(self.num_experts):
            counts = table[layer][:n]
            mean = sum(counts) / n
            if mean == 0:
                continue
            expert_max = max(expert_max, max(counts) / mean)
            expert_min = min(expert_min, min(counts) / mean)
            per = n // self.ep
            per_rank = [sum(counts[j * per : (j + 1) * per]) for j in range(self.ep)]
            ep_max = max(ep_max, max(per_rank) / (sum(per_rank) / self.ep))
        if expert_max == 0:
            return
        metrics["moe/expert_load_max"] = expert_max
        metrics["moe/expert_load_min"] = expert_min
        metrics["moe/ep_load_max"] = ep_max
        metrics["moe/a2a_rows_per_step"] = a2a / steps
        metrics["moe/expert_param_bytes"] = param_bytes

    @hookimpl
    def on_train_end(self, trainer: Any) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []
