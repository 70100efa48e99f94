"""The real-size recipes train with fp32 master weights, and the per-rank memory each header
states is what ``hyper-train memory estimate`` says for it (at the published model sizes)."""

from __future__ import annotations

import copy
import importlib.util
import json
import re
from pathlib import Path

import pytest
from mp_helpers import REPO, VL

from hyper_core.cli import main
from hyper_memory_profiler.cli import EXIT_DOES_NOT_FIT

pytestmark = pytest.mark.skipif(not VL, reason="needs hyper-train-qwen-vl")

CONFIGS = REPO / "configs"
KIMI = importlib.util.find_spec("hyper_kimi_k26") is not None


def qwen2_5_vl_72b_config() -> dict:
    """The published Qwen2.5-VL-72B-Instruct config.json: the 7B's with the 72B's sizes."""
    from hyper_qwen_vl.configs import QWEN2_5_VL

    cfg = copy.deepcopy(QWEN2_5_VL["qwen2.5-vl-7b"])
    cfg["text_config"].update(
        hidden_size=8192,
        intermediate_size=29568,
        num_hidden_layers=80,
        num_attention_heads=64,
        num_key_value_heads=8,
    )
    cfg["vision_config"].update(intermediate_size=3456, out_hidden_size=8192)
    return cfg


def header_gib(recipe: Path) -> float:
    """The estimated per-rank memory its header states (``# 36.3 GiB: fits ...``)."""
    match = re.search(r"^# (\d+\.\d) GiB(?::| against)", recipe.read_text(), re.MULTILINE)
    assert match, f"{recipe.name}: no estimated per-rank memory in the header"
    return float(match.group(1))


RECIPES = [
    pytest.param(
        "qwen2_5_vl_7b.toml",
        ["--nproc-per-node", "8", "--model-config", "qwen2.5-vl-7b", "--device-memory", "80GiB"],
        True,
        id="7b",
    ),
    pytest.param(
        "qwen2_5_vl_72b.toml",
        ["--nnodes", "4", "--nproc-per-node", "8", "--device-memory", "80GiB"],
        True,
        id="72b",
    ),
    pytest.param(
        "qwen3_vl_moe_30b.toml",
        ["--nproc-per-node", "8", "--model-config", "qwen3-vl-30b-a3b"],
        True,
        id="qwen3-vl-moe-30b",
    ),
    pytest.param(
        "kimi_k26.toml",
        ["--nnodes", "32", "--nproc-per-node", "8", "--model-config", "kimi-k2.6"],
        True,  # with expert parallelism (ep = 8)
        id="kimi",
        marks=pytest.mark.skipif(not KIMI, reason="needs hyper-train-kimi-k26"),
    ),
]


@pytest.mark.parametrize(("name", "args", "fits"), RECIPES)
def test_recipe_header_states_the_estimate(
    name: str, args: list[str], fits: bool, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    recipe = CONFIGS / name
    argv = ["memory", "estimate", str(recipe), *args, "--json"]
    if "--model-config" not in args:
        (tmp_path / "config.json").write_text(json.dumps(qwen2_5_vl_72b_config()))
        argv.append(f"--model.path={tmp_path}")
    if "--device-memory" not in args:
        argv += ["--device-memory", "141GB"]
    assert main(argv) == (0 if fits else 3)
    est = json.loads(capsys.readouterr().out)
    assert est["fits"] is fits
    # fp32 master weights: fp32 parameters and AdamW state; FSDP2 gathers bf16
    assert set(est["state"]["params"]["by_dtype"]) == {"float32"}
    assert set(est["state"]["optimizer"]["by_dtype"]) == {"float32"}
    assert est["precision"]["compute_weight_bytes"] == 2 and est["precision"]["autocast"]
    # logits at the label positions only, the 38% the headers state (no data to measure here)
    assert est["loss_path"]["mode"] in ("label_positions", "chunked")
    assert est["loss_path"]["label_fraction"] == 0.38
    assert est["per_rank"]["total"] / 2**30 == pytest.approx(header_gib(recipe), abs=0.06)


@pytest.mark.parametrize(
    "name",
    ["qwen2_5_vl_7b.toml", "qwen2_5_vl_72b.toml", "qwen3_vl_moe_30b.toml", "kimi_k26.toml"],
)
def test_recipes_use_fp32_master_weights(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    from hyper_core.config import load_config

    data = CONFIGS / "data" / "text_demo.jsonl"  # the recipe's data is the user's to supply
    overrides = [f"--data.train={data}", f"--data.eval={data}"]
    assert main(["config", "validate", str(CONFIGS / name), *overrides]) == 0
    assert ": ok" in capsys.readouterr().out
    cfg = load_config(CONFIGS / name, [], {})
    assert (cfg.model.dtype, cfg.training.mixed_precision) == ("float32", "bf16")
    assert cfg.parallel.param_dtype in (None, "bfloat16")


def test_72b_recipe_builds_the_published_model_on_meta(tmp_path: Path) -> None:
    from hyper_core.adapters.hf import match_modules
    from hyper_core.config import load_config
    from hyper_core.testing import isolated_host

    (tmp_path / "config.json").write_text(json.dumps(qwen2_5_vl_72b_config()))
    host = isolated_host(["hyper_qwen_vl.plugin"])
    config = load_config(
        CONFIGS / "qwen2_5_vl_72b.toml",
        [f"--model.path={tmp_path}"],
        host.registries.config_sections,
    )
    adapter = host.registries.model_adapters.get(config.model.adapter)()
    model = adapter.build_model(config.model, device="meta")
    total = sum(p.numel() for p in model.parameters())
    assert abs(total - 73.4e9) / 73.4e9 < 0.01, total  # 73.4 B published
    assert {str(p.dtype) for p in model.parameters()} == {"torch.float32"}
    units = match_modules(model, adapter.parallel_plan(model).sharding_units)
    assert len(units) == 80 + 32


@pytest.mark.skipif(importlib.util.find_spec("hyper_peft") is None, reason="needs hyper-train-peft")
def test_lora_recipe_fits_one_gpu(capsys: pytest.CaptureFixture[str]) -> None:
    """LoRA r=16 on the language model of the 7B: one 24 GB GPU at 4096 tokens, the frozen
    base in bf16 ([peft] base_dtype), gradients and AdamW state only for the 40.4 M fp32 LoRA
    weights (16 per layer and projection: 28 layers × 16 × (in + out) of q, k, v, o, gate, up,
    down). With the base in fp32 it does not fit, and the estimate says what to change."""
    recipe = CONFIGS / "qwen2_5_vl_7b_lora.toml"
    argv = ["memory", "estimate", str(recipe), "--model-config", "qwen2.5-vl-7b"]
    assert main([*argv, "--device-memory", "24GiB", "--json"]) == 0
    est = json.loads(capsys.readouterr().out)
    assert est["fits"] and est["layout"]["world_size"] == 1
    trainable = 28 * 16 * (2 * (3584 + 3584) + 2 * (3584 + 512) + 3 * (3584 + 18944))
    assert est["parameters"]["trainable"] == trainable == 40_370_176
    assert est["per_rank"]["grads"] == 4 * trainable
    params = est["state"]["params"]["by_dtype"]
    assert params["float32"] == 4 * trainable  # only the LoRA weights are fp32
    assert params["bfloat16"] == 2 * (est["parameters"]["total"] - trainable)
    assert est["per_rank"]["weight_copies"] == 0  # a bf16 base needs no autocast copy
    assert set(est["state"]["grads"]["by_group"]) == {"language"}
    assert est["loss_path"]["mode"] == "label_positions"
    assert est["per_rank"]["total"] / 2**30 == pytest.approx(header_gib(recipe), abs=0.06)

    fp32 = [*argv, "--device-memory", "24GiB", "--peft.base_dtype=float32"]
    assert main(fp32) == EXIT_DOES_NOT_FIT
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert last.startswith('to need less, change: [peft] base_dtype = "bfloat16"'), last
