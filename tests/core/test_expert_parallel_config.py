"""Bad ``[parallel] ep`` values are one ``$.parallel.ep`` error (exit 2), before or at start-up;
the gradient norm over several meshes is the norm of all gradients."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from hyper_core.adapters.base import ParallelPlan
from hyper_core.cli.main import main
from hyper_core.config import ModelConfig
from hyper_core.errors import ConfigError
from hyper_core.parallel.env import DistEnv
from hyper_core.parallel.expert_parallel import expert_parallel_plan
from hyper_core.parallel.fsdp2 import FSDP2
from hyper_core.parallel.simple import DDP
from hyper_core.step.grad_norm import by_mesh, clip_grads, total_grad_norm

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["--nproc-per-node", "4", "--parallel.ep=3"],
            "$.parallel.ep: with 4 ranks (--nproc-per-node 4): 3 does not divide dp_shard (4)",
        ),
        (
            ["--nproc-per-node", "1", "--parallel.ep=2"],
            "$.parallel.ep: 2 needs at least 2 ranks, got 1",
        ),
        (["--parallel.ep=0"], "$.parallel.ep: must be >= 1, got 0"),
    ],
)
def test_bad_ep_fails_validation_with_its_path(
    args: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    config = str(REPO / "configs" / "text_demo.toml")
    assert main(["config", "validate", config, "--parallel.strategy=fsdp2", *args]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err and len(err.strip().splitlines()) == 1


def _built(adapter_name: str, config: str) -> tuple[object, torch.nn.Module]:
    from hyper_core.plugins import get_plugin_host
    from hyper_core.resolve import resolve_adapter

    model_config = ModelConfig(adapter=adapter_name, config=config)
    adapter = resolve_adapter(model_config, get_plugin_host().registries)
    return adapter, adapter.build_model(model_config, device="meta")


def _plan(adapter_name: str, config: str, ep: int, strategy: object) -> ParallelPlan:
    adapter, model = _built(adapter_name, config)
    dist = DistEnv(world_size=ep, ep=ep)
    return expert_parallel_plan(ParallelPlan(sharding_units=()), model, adapter, strategy, dist, ep)


def test_ep_on_a_dense_model_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match=r"\$\.parallel\.ep: 2: .* has no MoE blocks"):
        _plan("hf_causal_lm", "tiny-qwen2", 2, FSDP2(None, None))


@pytest.mark.parametrize("ep", [3, 8])
def test_ep_must_divide_the_expert_count(ep: int) -> None:
    with pytest.raises(ConfigError, match=rf"\$\.parallel\.ep: {ep} must divide the 4 routed"):
        _plan("qwen3_vl_moe", "tiny", ep, FSDP2(None, None))


def test_ep_needs_a_strategy_with_expert_parallelism() -> None:
    with pytest.raises(ConfigError, match=r"\$\.parallel\.ep: 2: strategy 'ddp' has no expert"):
        _plan("qwen3_vl_moe", "tiny", 2, DDP(None, None))


def test_ep_plan_lists_the_moe_blocks() -> None:
    plan = _plan("qwen3_vl_moe", "tiny", 2, FSDP2(None, None))
    assert [b.experts for b in plan.moe_blocks] == [
        f"model.language_model.layers.{i}.mlp.experts" for i in range(2)
    ]


def test_grad_norm_and_clipping_over_groups_equal_one_group() -> None:
    torch.manual_seed(0)
    params = [torch.nn.Parameter(torch.randn(5, 3)) for _ in range(3)]
    for p in params:
        p.grad = torch.randn_like(p)
    expected = math.sqrt(sum(float(p.grad.pow(2).sum()) for p in params))
    assert len(by_mesh(p.grad for p in params)) == 1
    norm = total_grad_norm(params)
    assert norm is not None and float(norm) == pytest.approx(expected, rel=1e-6)
    clip_grads(params, 1.0, norm)
    assert float(total_grad_norm(params)) == pytest.approx(1.0, rel=1e-5)
    assert total_grad_norm([torch.nn.Parameter(torch.ones(2))]) is None
