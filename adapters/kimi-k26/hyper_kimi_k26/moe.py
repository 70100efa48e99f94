"""MoE router statistics, accumulated on the device and reported with the logged metrics.

A forward hook on every router (``DeepseekV3TopkRouter``: ``mlp.gate`` of the MoE layers) adds,
per training forward, the number of routed assignments of each expert (``bincount`` of the
chosen top-k indices) and the sum over tokens of the normalised router scores. No host sync
happens until :meth:`RouterStats.collect` (called from ``on_log``), which sums them over ranks,
resets them and returns, over the logged steps:

* ``moe/load_max``, ``moe/load_min``: the most and least loaded expert of any MoE layer,
  as a multiple of the uniform load (``fraction · E``; 1.0 = perfectly balanced);
* ``moe/load_cv``: the coefficient of variation of the per-expert load, averaged over layers;
* ``moe/balance``: the Switch-style balance statistic ``E · Σ_i f_i · p_i`` (f: assignment
  fraction, p: mean normalised score), averaged over layers (1.0 when balanced). Kimi trains
  with aux-loss-free balancing (``e_score_correction_bias``), so this is logged, not added to
  the loss;
* ``moe/dead_experts``: experts that received no token in some layer, summed over layers.

Only forwards in training mode are counted (evaluation is not); padding tokens of the
``padded`` runtime are routed too and therefore counted. With activation checkpointing the
forward recomputed in backward is not counted again. Counting uses ``index_add_``, which does
not make a CUDA step wait on the host (``bincount`` would).

A Kimi run owns one :class:`RouterStatsRun` (the plugin's ``build_callbacks``), which hooks the
routers when training begins, logs with every logged step and removes the hooks at the end.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from hyper_core import hookimpl
from hyper_core.parallel.moe_stats import in_backward

if TYPE_CHECKING:
    import torch


def router_modules(model: torch.nn.Module) -> list[tuple[str, torch.nn.Module]]:
    """``(name, module)`` of the top-k routers (modules with ``top_k``, ``num_experts`` and a
    ``(E, H)`` ``weight``; DeepSeek-V3's ``mlp.gate``)."""
    out = []
    for name, module in model.named_modules():
        if type(module).__name__.endswith("TopkRouter") and hasattr(module, "top_k"):
            out.append((name, module))
    return out


class RouterStats:
    """Per-layer expert-assignment counts of the routers of ``model`` (see the module doc)."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.routers = router_modules(model)
        self.num_experts = int(self.routers[0][1].num_experts) if self.routers else 0
        self._counts: dict[int, Any] = {}
        self._scores: dict[int, Any] = {}
        self._handles = [
            module.register_forward_hook(self._hook(i))
            for i, (_, module) in enumerate(self.routers)
        ]

    def _hook(self, index: int) -> Any:
        def hook(module: torch.nn.Module, args: Any, output: Any) -> None:
            import torch

            if not module.training or in_backward():
                return  # evaluation, or activation checkpointing's recompute of the forward
            router_logits, _, topk_indices = output
            with torch.no_grad():
                # index_add_ rather than bincount, whose output size makes CUDA sync
                flat = topk_indices.flatten()
                counts = torch.zeros(self.num_experts, dtype=torch.float64, device=flat.device)
                counts.index_add_(0, flat, torch.ones_like(flat, dtype=torch.float64))
                scores = router_logits.detach().float().sigmoid()
                scores = scores / scores.sum(dim=-1, keepdim=True).clamp_min(1e-20)
                score_sum = scores.sum(dim=0)
                if index in self._counts:
                    self._counts[index] += counts
                    self._scores[index] += score_sum
                else:
                    self._counts[index] = counts
                    self._scores[index] = score_sum.to(torch.float64)

        return hook

    def remove(self) -> None:
        """Detach the hooks."""
        for handle in self._handles:
            handle.remove()
        self._handles = []

    def collect(self, dist: Any = None) -> dict[str, float]:
        """The statistics since the last call (summed over ranks via ``dist.all_reduce_sum``),
        then reset. Every rank must call it (it is a collective when distributed)."""
        import torch

        if not self.routers:
            return {}
        layers = range(len(self.routers))
        device = next(iter(self._counts.values())).device if self._counts else "cpu"
        if dist is not None and getattr(dist, "world_size", 1) > 1 and dist.device is not None:
            device = dist.device
        zeros = torch.zeros(self.num_experts, dtype=torch.float64, device=device)
        counts = torch.stack([self._counts.get(i, zeros).to(device) for i in layers])
        scores = torch.stack([self._scores.get(i, zeros).to(device) for i in layers])
        self._counts, self._scores = {}, {}
        if dist is not None:
            both = torch.cat([counts, scores], dim=0)
            dist.all_reduce_sum(both)
            counts, scores = both[: len(layers)], both[len(layers) :]
        assigned = counts.sum(dim=-1, keepdim=True)
        seen = assigned.squeeze(-1) > 0
        if not bool(seen.any()):
            return {}
        counts, scores, assigned = counts[seen], scores[seen], assigned[seen]
        e = self.num_experts
        fraction = counts / assigned
        load = fraction * e
        # tokens = assignments / top_k; the mean normalised score over tokens
        top_k = float(self.routers[0][1].top_k)
        mean_score = scores / (assigned / top_k)
        return {
            "moe/load_max": float(load.max()),
            "moe/load_min": float(load.min()),
            "moe/load_cv": float((load.std(dim=-1, unbiased=False) / load.mean(dim=-1)).mean()),
            "moe/balance": float((e * (fraction * mean_score).sum(dim=-1)).mean()),
            "moe/dead_experts": float((counts == 0).sum()),
        }


class RouterStatsRun:
    """One run's router statistics: the per-run object of the Kimi plugin."""

    def __init__(self) -> None:
        self.stats: RouterStats | None = None

    @hookimpl
    def on_train_begin(self, trainer: Any) -> None:
        """Hook the MoE routers (device-side counters, no sync per step)."""
        self.stats = RouterStats(trainer.unwrapped_model)

    @hookimpl
    def on_log(self, trainer: Any, metrics: dict[str, Any]) -> None:
        """Add ``moe/load_max``, ``moe/load_min``, ``moe/load_cv``, ``moe/balance``,
        ``moe/dead_experts`` over the steps since the last log (a collective on every rank)."""
        if self.stats is not None:
            metrics.update(self.stats.collect(trainer.dist))

    @hookimpl
    def on_train_end(self) -> None:
        """Leave no hook on the trained model."""
        self._remove()

    @hookimpl
    def on_train_error(self) -> None:
        """Leave no hook on the model of a failed run."""
        self._remove()

    def _remove(self) -> None:
        if self.stats is not None:
            self.stats.remove()
