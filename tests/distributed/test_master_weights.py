"""fp32 master weights on 2 ranks under fsdp2: with ``mixed_precision = "bf16"`` alone the
sharded parameters and AdamW state are fp32, while forward sees bf16 gathered parameters and
gradients are reduced in fp32. One process under fsdp2 computes in the same dtypes (its
1-rank mesh), the decoder's attention included.

The job runs in the shared 2-rank launch; :func:`dtypes` (its ``inspect``) records what the
ranks saw, and rank 0 writes it to ``inspect.json`` in the run's output directory.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from dist_helpers import TwoRankRuns, losses, text_config

pytestmark = pytest.mark.slow
TWO_RANK_TIMEOUT_S = 300
STEPS = 2


def dtypes(trainer: Any) -> Callable[[], dict[str, Any]]:
    """Record the dtypes FSDP2 uses while ``trainer`` trains; the record, after training."""
    import torch

    model = trainer.model
    seen: dict[str, Any] = {"forward_weight": set(), "forward_output": set(), "attention": set()}
    sdpa = torch.nn.functional.scaled_dot_product_attention

    def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *a: Any, **kw: Any) -> Any:
        seen["attention"].add(f"q={q.dtype} k={k.dtype} v={v.dtype}")
        return sdpa(q, k, v, *a, **kw)

    # Looked up at call time by transformers' sdpa attention; this process only trains.
    torch.nn.functional.scaled_dot_product_attention = attention
    name, linear = next((n, m) for n, m in model.named_modules() if n.endswith("q_proj"))

    def record(module: torch.nn.Module, args: Any, output: torch.Tensor) -> None:
        seen["forward_weight"].add(str(module.weight.dtype))
        seen["forward_output"].add(str(output.dtype))

    linear.register_forward_hook(record)
    unit = next(m for m in model.modules() if hasattr(m, "_get_fsdp_state") and m is not model)
    policy = unit._get_fsdp_state()._fsdp_param_group.mp_policy

    def result() -> dict[str, Any]:
        torch.nn.functional.scaled_dot_product_attention = sdpa
        optimizer = trainer.optimizer
        states = {
            str(t.dtype) for s in optimizer.state.values() for k, t in s.items() if k != "step"
        }
        return {
            "linear": name,
            "param_dtype": str(policy.param_dtype),
            "reduce_dtype": str(policy.reduce_dtype),
            "params": sorted({str(p.dtype) for p in model.parameters()}),
            "sharded": all(type(p).__name__ == "DTensor" for p in model.parameters()),
            "optimizer_state": sorted(states),
            "forward_weight": sorted(seen["forward_weight"]),
            "forward_output": sorted(seen["forward_output"]),
            "attention": sorted(seen["attention"]),
        }

    return result


def bf16_config(out: Path) -> dict[str, Any]:
    """The tiny text run under fsdp2 with ``mixed_precision = "bf16"`` (sdpa attention)."""
    return text_config(
        out,
        model={"attn_implementation": "sdpa"},
        training={"steps": STEPS, "mixed_precision": "bf16"},
        parallel={"strategy": "fsdp2", "timeout_s": 60},
    )


def two_rank_jobs(root: Path) -> list[dict[str, Any]]:
    """This module's job of the shared 2-rank launch (``conftest.two_rank_runs``)."""
    return [{"config": bf16_config(root / "run"), "inspect": f"{__name__}:dtypes"}]


def test_default_bf16_training_keeps_fp32_master_weights_on_two_ranks(
    two_rank_runs: TwoRankRuns,
) -> None:
    out = two_rank_runs.dir(__name__) / "run"
    seen = json.loads((out / "inspect.json").read_text())
    print(seen)
    # the master weights and AdamW state: fp32, sharded
    assert seen["params"] == ["torch.float32"] and seen["sharded"]
    assert seen["optimizer_state"] == ["torch.float32"]
    # FSDP2 gathers bf16 (forward sees bf16 weights) and reduces in fp32
    assert (seen["param_dtype"], seen["reduce_dtype"]) == ("torch.bfloat16", "torch.float32")
    assert seen["forward_weight"] == ["torch.bfloat16"]
    assert seen["forward_output"] == ["torch.bfloat16"]
    assert len(losses(out)) == STEPS


def test_one_process_computes_in_the_dtypes_of_two_ranks(
    two_rank_runs: TwoRankRuns, tmp_path: Path
) -> None:
    from hyper_core.config import load_config_dict
    from hyper_core.parallel.setup import end_distributed
    from hyper_core.plugins import get_plugin_host
    from hyper_core.trainer.trainer import Trainer

    two = json.loads((two_rank_runs.dir(__name__) / "run" / "inspect.json").read_text())
    host = get_plugin_host()
    config = load_config_dict(
        bf16_config(tmp_path / "run"), sections=host.registries.config_sections
    )
    trainer = Trainer(config, host)
    try:
        trainer.setup()
        assert trainer.dist.world_size == 1
        seen = dtypes(trainer)
        trainer.train()
        one = seen()
    finally:
        end_distributed()
    print(one)
    # bf16 q/k/v into the decoder's attention, not fp32 q/k from fp32 RoPE tables
    assert one["attention"] == ["q=torch.bfloat16 k=torch.bfloat16 v=torch.bfloat16"]
    assert one == two
