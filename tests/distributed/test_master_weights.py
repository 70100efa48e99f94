"""fp32 master weights on 2 ranks under fsdp2: with ``mixed_precision = "bf16"`` alone the
sharded parameters and AdamW state are fp32, while forward sees bf16 gathered parameters and
gradients are reduced in fp32.

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
    seen: dict[str, Any] = {"forward_weight": set(), "forward_output": set()}
    name, linear = next((n, m) for n, m in model.named_modules() if n.endswith("q_proj"))

    def record(module: torch.nn.Module, args: Any, output: torch.Tensor) -> None:
        seen["forward_weight"].add(str(module.weight.dtype))
        seen["forward_output"].add(str(output.dtype))

    linear.register_forward_hook(record)
    unit = next(m for m in model.modules() if hasattr(m, "_get_fsdp_state") and m is not model)
    policy = unit._get_fsdp_state()._fsdp_param_group.mp_policy

    def result() -> dict[str, Any]:
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
        }

    return result


def two_rank_jobs(root: Path) -> list[dict[str, Any]]:
    """This module's job of the shared 2-rank launch (``conftest.two_rank_runs``)."""
    raw = text_config(
        root / "run",
        training={"steps": STEPS, "mixed_precision": "bf16"},
        parallel={"strategy": "fsdp2", "timeout_s": 60},
    )
    return [{"config": raw, "inspect": f"{__name__}:dtypes"}]


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
