"""Reading a whole HF checkpoint into a meta-built, unsharded model (``ddp`` from ``[model]
path``, every rank): frozen parameters stay frozen, and a strategy's ``AFTER_LOAD`` callback
runs once the weights are in."""

from __future__ import annotations

from pathlib import Path

import torch

from hyper_core.config import load_config_dict
from hyper_core.parallel.env import DistEnv
from hyper_core.parallel.hf_load import AFTER_LOAD, load_hf_shards
from hyper_core.parallel.materialize import materialize_buffers
from hyper_core.plugins import get_plugin_host
from hyper_core.resolve import resolve_adapter
from hyper_core.testing import tiny_text_config


def test_frozen_parameters_stay_frozen_and_after_load_runs_once(tmp_path: Path) -> None:
    raw = tiny_text_config(tmp_path / "run")
    config = load_config_dict(raw)
    adapter = resolve_adapter(config.model, get_plugin_host().registries)
    torch.manual_seed(0)
    reference = adapter.build_model(config.model)
    reference.save_pretrained(str(tmp_path / "hf"))
    raw["model"] = {"adapter": "hf_causal_lm", "path": str(tmp_path / "hf")}
    model_config = load_config_dict(raw).model

    model = adapter.build_model(model_config, device="meta")
    frozen = {n for n in dict(model.named_parameters()) if ".layers.0." in n}
    assert frozen
    for name, param in model.named_parameters():
        param.requires_grad_(name not in frozen)
    calls: list[bool] = []
    setattr(model, AFTER_LOAD, lambda: calls.append(any(p.is_meta for p in model.parameters())))
    materialize_buffers(model, torch.device("cpu"))
    load_hf_shards(
        model,
        tmp_path / "hf",
        DistEnv(device=torch.device("cpu")),
        adapter.checkpoint_conversions(model),
    )
    assert calls == [False]  # once, with every weight in
    assert not hasattr(model, AFTER_LOAD)
    ref = reference.state_dict()
    for name, param in model.named_parameters():
        assert param.requires_grad == (name not in frozen), name
        assert torch.equal(param, ref[name]), name
