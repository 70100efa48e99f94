"""Reading a whole HF checkpoint into a meta-built, unsharded model (``ddp`` from ``[model]
path``, every rank) through the core's ``parallelize_model`` stage and the run's load plan:
frozen parameters stay frozen, the strategy is told the plan and hears once that the weights
are in, inside the plan's checkpoint view."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from hyper_core.adapters.base import ParallelPlan
from hyper_core.builtin.stages import parallelize_model
from hyper_core.config import load_config_dict
from hyper_core.parallel.base import ParallelStrategy
from hyper_core.parallel.env import DistEnv
from hyper_core.parallel.load_plan import LoadPlan
from hyper_core.parallel.materialize import materialize_buffers
from hyper_core.plugins import get_plugin_host
from hyper_core.resolve import resolve_adapter
from hyper_core.testing import tiny_text_config


class Recording(ParallelStrategy):
    """Allocates buffers, as ``ddp`` does before a whole-model load, and records its calls."""

    def __init__(self, parallel_config: Any, training_config: Any) -> None:
        super().__init__(parallel_config, training_config)
        self.plans: list[LoadPlan | None] = []
        self.loaded: list[bool] = []  # whether any parameter was still on meta

    def apply(self, model: torch.nn.Module, plan: ParallelPlan, dist: DistEnv) -> torch.nn.Module:
        self.plans.append(plan.load)
        materialize_buffers(model, dist.device)
        return model

    def weights_loaded(self, model: torch.nn.Module) -> None:
        self.loaded.append(any(p.is_meta for p in model.parameters()))


def test_frozen_parameters_stay_frozen_and_the_strategy_hears_of_the_load(tmp_path: Path) -> None:
    raw = tiny_text_config(tmp_path / "run")
    config = load_config_dict(raw)
    adapter = resolve_adapter(config.model, get_plugin_host().registries)
    torch.manual_seed(0)
    reference = adapter.build_model(config.model)
    reference.save_pretrained(str(tmp_path / "hf"))
    raw["model"] = {"adapter": "hf_causal_lm", "path": str(tmp_path / "hf")}
    config = load_config_dict(raw)

    model = adapter.build_model(config.model, device="meta")
    frozen = {n for n in dict(model.named_parameters()) if ".layers.0." in n}
    assert frozen
    for name, param in model.named_parameters():
        param.requires_grad_(name not in frozen)
    views: list[bool] = []  # whether the parameters were on meta when the view was entered

    @contextlib.contextmanager
    def view(viewed: torch.nn.Module) -> Iterator[None]:
        views.append(all(p.is_meta for p in viewed.parameters()))
        yield

    load = LoadPlan(meta_init=True, sharded_load=True, checkpoint_view=view)
    strategy = Recording(config.parallel, config.training)
    dist = DistEnv(device=torch.device("cpu"))
    out = parallelize_model(config, model, adapter, dist, strategy, load)
    assert out is model and strategy.plans == [load]
    assert views == [True] and strategy.loaded == [False]  # once, with every weight in
    ref = reference.state_dict()
    for name, param in model.named_parameters():
        assert param.requires_grad == (name not in frozen), name
        assert torch.equal(param, ref[name]), name
