"""fp32 master weights on 2 ranks under fsdp2: with ``mixed_precision = "bf16"`` alone the
sharded parameters and AdamW state are fp32, while forward sees bf16 gathered parameters and
gradients are reduced in fp32.

Run as a script (by torchrun) it is the worker: it trains the job of ``JOB.json`` and rank 0
writes what it saw to ``seen.json`` in the run's output directory.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

STEPS = 2


def _inspect(job_file: str) -> None:
    """The worker: train while recording the dtypes FSDP2 uses."""
    import os

    import torch

    from hyper_core.config import load_config_dict
    from hyper_core.plugins import get_plugin_host
    from hyper_core.trainer.trainer import Trainer

    host = get_plugin_host()
    raw = json.loads(Path(job_file).read_text())
    config = load_config_dict(raw, sections=host.registries.config_sections)
    trainer = Trainer(config, host)
    trainer.setup()
    model = trainer.model
    seen: dict[str, Any] = {"forward_weight": set(), "forward_output": set()}
    name, linear = next((n, m) for n, m in model.named_modules() if n.endswith("q_proj"))

    def record(module: torch.nn.Module, args: Any, output: torch.Tensor) -> None:
        seen["forward_weight"].add(str(module.weight.dtype))
        seen["forward_output"].add(str(output.dtype))

    linear.register_forward_hook(record)
    unit = next(m for m in model.modules() if hasattr(m, "_get_fsdp_state") and m is not model)
    policy = unit._get_fsdp_state()._fsdp_param_group.mp_policy
    trainer.train()
    optimizer = trainer.optimizer
    states = {str(t.dtype) for s in optimizer.state.values() for k, t in s.items() if k != "step"}
    result = {
        "linear": name,
        "param_dtype": str(policy.param_dtype),
        "reduce_dtype": str(policy.reduce_dtype),
        "params": sorted({str(p.dtype) for p in model.parameters()}),
        "sharded": all(type(p).__name__ == "DTensor" for p in model.parameters()),
        "optimizer_state": sorted(states),
        "forward_weight": sorted(seen["forward_weight"]),
        "forward_output": sorted(seen["forward_output"]),
    }
    if int(os.environ.get("RANK", "0")) == 0:
        (Path(config.run.output_dir) / "seen.json").write_text(json.dumps(result))
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()


@pytest.mark.slow
def test_default_bf16_training_keeps_fp32_master_weights_on_two_ranks(tmp_path: Path) -> None:
    from dist_helpers import losses, text_config, torchrun

    out = tmp_path / "run"
    raw = text_config(
        out,
        training={"steps": STEPS, "mixed_precision": "bf16"},
        parallel={"strategy": "fsdp2", "timeout_s": 60},
    )
    job = tmp_path / "job.json"
    job.write_text(json.dumps(raw))
    proc = torchrun(Path(__file__), [str(job)], nproc=2, timeout=300)
    assert proc.returncode == 0, proc.stderr[-6000:]
    seen = json.loads((out / "seen.json").read_text())
    print(seen)
    # the master weights and AdamW state: fp32, sharded
    assert seen["params"] == ["torch.float32"] and seen["sharded"]
    assert seen["optimizer_state"] == ["torch.float32"]
    # FSDP2 gathers bf16 (forward sees bf16 weights) and reduces in fp32
    assert (seen["param_dtype"], seen["reduce_dtype"]) == ("torch.bfloat16", "torch.float32")
    assert seen["forward_weight"] == ["torch.bfloat16"]
    assert seen["forward_output"] == ["torch.bfloat16"]
    assert len(losses(out)) == STEPS


if __name__ == "__main__":
    _inspect(sys.argv[1])
