"""``[peft] base_dtype``: the frozen base in bf16, the adapters and their AdamW state in fp32.

Equivalence: LoRA on a bf16 base trains as LoRA on the same base held in fp32 with its values
rounded to bf16 (same losses and gradient norms of the adapters for a few steps, within bf16's
precision), with and without bf16 autocast."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from peft_helpers import load, lora_config, train

STEPS = 3


@pytest.fixture(scope="module")
def bf16_valued_base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny text model (seed 0) as an fp32 HF directory whose values are bf16's."""
    from hyper_core.plugins import get_plugin_host
    from hyper_core.resolve import resolve_adapter
    from hyper_core.testing import tiny_text_config

    out = tmp_path_factory.mktemp("base")
    config = load(tiny_text_config(out / "unused"))
    adapter = resolve_adapter(config.model, get_plugin_host().registries)
    torch.manual_seed(0)
    model = adapter.build_model(config.model)
    with torch.no_grad():
        for param in model.parameters():
            param.copy_(param.to(torch.bfloat16).float())
    adapter.export_hf(
        model.state_dict(), model.config, out / "hf", assets=adapter.build_assets(config.model)
    )
    return out / "hf"


def _run(tmp: Path, base: Path, mixed_precision: str, base_dtype: str | None) -> Any:
    peft = {"method": "lora", "r": 8, **({"base_dtype": base_dtype} if base_dtype else {})}
    raw = lora_config(
        tmp, training={"steps": STEPS, "lr": 1e-2, "mixed_precision": mixed_precision}, peft=peft
    )
    raw["model"] = {"adapter": "hf_causal_lm", "path": str(base)}
    return train(raw)


@pytest.mark.parametrize("mixed_precision", ["no", "bf16"])
def test_a_bf16_base_trains_as_the_fp32_base_rounded_to_bf16(
    tmp_path: Path, bf16_valued_base: Path, mixed_precision: str
) -> None:
    fp32 = _run(tmp_path / "fp32", bf16_valued_base, mixed_precision, None)
    bf16 = _run(tmp_path / "bf16", bf16_valued_base, mixed_precision, "bfloat16")
    ref, got = fp32.trainer.unwrapped_model, bf16.trainer.unwrapped_model
    frozen = {str(p.dtype) for p in got.parameters() if not p.requires_grad}
    trained = {n: p for n, p in got.named_parameters() if p.requires_grad}
    assert frozen == {"torch.bfloat16"}
    assert {str(p.dtype) for p in trained.values()} == {"torch.float32"}
    states = [s for s in bf16.trainer.optimizer.state.values() if "exp_avg" in s]
    assert states and all(s["exp_avg"].dtype == torch.float32 for s in states)
    # the same base values: only the compute's precision differs
    base = {n: p for n, p in ref.named_parameters() if not p.requires_grad}
    for name, param in got.named_parameters():
        if not param.requires_grad:
            assert torch.equal(base[name].to(param.dtype), param), name
    torch.testing.assert_close(
        torch.tensor(bf16.losses), torch.tensor(fp32.losses), rtol=1e-2, atol=0.0
    )
    norms = [[m["grad_norm"] for m in r.metrics if "grad_norm" in m] for r in (fp32, bf16)]
    torch.testing.assert_close(torch.tensor(norms[1]), torch.tensor(norms[0]), rtol=5e-2, atol=0.0)
