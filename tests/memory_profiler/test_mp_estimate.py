"""The estimator on a real-size config (meta device only) and its sharding arithmetic."""

from __future__ import annotations

import json
import pathlib
from typing import Any

import pytest
from mp_helpers import QWEN25_VL_7B_PARAMS, VL, write_7b

pytestmark = pytest.mark.skipif(not VL, reason="needs hyper-train-qwen-vl")


@pytest.fixture(scope="module")
def seven_b(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The 7B model built once on meta, its adapter and a config loader."""
    from hyper_core.config import load_config
    from hyper_core.plugins.manager import PluginHost
    from hyper_core.resolve import resolve_adapter
    from hyper_memory_profiler.estimate import build_meta_model

    root = tmp_path_factory.mktemp("7b")
    path = write_7b(root)
    host = PluginHost()

    def config(*overrides: str) -> Any:
        return load_config(path, list(overrides), host.registries.config_sections)

    adapter = resolve_adapter(config().model, host.registries)
    return {
        "path": path,
        "host": host,
        "config": config,
        "adapter": adapter,
        "model": build_meta_model(config(), adapter),
    }


def _estimate(
    seven_b: dict[str, Any], world: int, *overrides: str, batch: Any = None, model: Any = None
) -> Any:
    from hyper_core.resolve import resolve_strategy
    from hyper_memory_profiler.estimate import estimate_model, layout_for

    cfg = seven_b["config"](*overrides)
    strategy = resolve_strategy(cfg, seven_b["host"].registries)
    layout = layout_for(cfg, strategy, world)
    model = model if model is not None else seven_b["model"]
    return estimate_model(model, seven_b["adapter"], cfg, layout, batch)


def test_meta_model_is_the_real_7b(seven_b: dict[str, Any]) -> None:
    model = seven_b["model"]
    assert all(p.is_meta for p in model.parameters())
    assert sum(p.numel() for p in model.parameters()) == QWEN25_VL_7B_PARAMS


def test_state_per_rank_under_fsdp2(seven_b: dict[str, Any]) -> None:
    one = _estimate(seven_b, 1)
    eight = _estimate(seven_b, 8)
    assert one.rows["params"] == 4 * QWEN25_VL_7B_PARAMS
    assert one.layout.param_shards == 1 and eight.layout.param_shards == 8
    # rank 0 holds ceil(d0/8) rows of every tensor: a little over an eighth
    assert one.rows["params"] / 8 <= eight.rows["params"] < one.rows["params"] / 8 * 1.001
    n = eight.state["params"]["count"]
    assert eight.rows["grads"] == eight.rows["params"]
    assert eight.rows["optimizer"] == 2 * eight.rows["params"] + 4 * n
    # ddp replicates
    ddp = _estimate(seven_b, 8, '--parallel.strategy="ddp"')
    assert ddp.rows["params"] == one.rows["params"]
    # freezing the vision tower drops its gradients and optimizer state, not its parameters
    from hyper_memory_profiler.estimate import build_meta_model

    freeze = '--model.freeze=["vision"]'
    model = build_meta_model(seven_b["config"](freeze), seven_b["adapter"])
    frozen = _estimate(seven_b, 8, freeze, model=model)
    assert "vision" not in frozen.state["grads"]["by_group"]
    assert frozen.state["params"]["by_group"] == eight.state["params"]["by_group"]
    assert frozen.rows["optimizer"] < eight.rows["optimizer"]


def test_fp32_master_weights(seven_b: dict[str, Any]) -> None:
    """bf16 training of fp32 weights: fp32 parameters, gradients and two fp32 AdamW moments
    per parameter, sharded; FSDP2 gathers bf16 units and reduces gradients in fp32."""
    from hyper_memory_profiler.estimate import build_meta_model, model_shape

    est = _estimate(seven_b, 8)
    params = est.rows["params"]
    assert est.state["params"]["by_dtype"] == {"float32": params}
    assert params == pytest.approx(4 * QWEN25_VL_7B_PARAMS / 8, rel=1e-3)
    assert est.rows["grads"] == params
    assert est.state["optimizer"]["by_dtype"]["float32"] == est.rows["optimizer"]
    assert est.rows["optimizer"] == 2 * params + 4 * est.state["params"]["count"]
    # in flight: the root and two units gathered in bf16, one unit's gradients reduced in fp32
    assert (est.precision.compute_weight_bytes, est.precision.reduce_bytes) == (2, 4)
    shape = model_shape(seven_b["model"], seven_b["adapter"])
    unit = max(shape.unit_numels)
    assert est.transient["fsdp_unsharded"] == (shape.root_numel + 2 * unit) * 2 + unit * 4
    # explicit [parallel] dtypes still win
    explicit = _estimate(
        seven_b, 8, '--parallel.param_dtype="float32"', '--parallel.reduce_dtype="bfloat16"'
    )
    assert (explicit.precision.compute_weight_bytes, explicit.precision.reduce_bytes) == (4, 2)
    # pure bf16 (opt-in) halves the state
    bf16 = '--model.dtype="bfloat16"'
    pure = _estimate(
        seven_b, 8, bf16, model=build_meta_model(seven_b["config"](bf16), seven_b["adapter"])
    )
    assert pure.rows["params"] == params // 2
    assert pure.rows["optimizer"] == params + 4 * est.state["params"]["count"]


def test_activation_levers(seven_b: dict[str, Any]) -> None:
    base = _estimate(seven_b, 8)
    assert base.batch.tokens == 4096 and base.batch.patches == 5120  # max_pixels / 14²
    ckpt = _estimate(seven_b, 8, "--training.activation_checkpointing=true")
    assert ckpt.rows["activations"] < base.rows["activations"] / 5
    assert ckpt.transient["recompute"] > 0
    # bf16 autocast of fp32 gathered weights keeps bf16 copies of every matmul weight for
    # backward (every weight but the embedding table; biases and norms are not copied)...
    fp32 = _estimate(seven_b, 8, '--parallel.param_dtype="float32"')
    embedding = 152064 * 3584
    assert fp32.rows["weight_copies"] == pytest.approx(
        2 * (QWEN25_VL_7B_PARAMS - embedding), rel=1e-3
    )
    # ...which the default bf16 gather (fp32 master weights) does not need
    assert base.rows["weight_copies"] == 0
    assert base.transient["fsdp_unsharded"] < fp32.transient["fsdp_unsharded"]
    # activations grow linearly with the tokens when the sequence has no mask
    from hyper_memory_profiler.estimate import BatchShape

    small = _estimate(seven_b, 8, batch=BatchShape(rows=1, seq_len=1024, samples=1))
    large = _estimate(seven_b, 8, batch=BatchShape(rows=1, seq_len=2048, samples=1))
    assert large.rows["activations"] == pytest.approx(2 * small.rows["activations"], rel=1e-3)
    # ... and gain the per-layer SDPA mask when several samples share the row
    packed = _estimate(seven_b, 8, batch=BatchShape(rows=1, seq_len=2048, samples=2))
    assert packed.rows["activations"] > large.rows["activations"]


def test_context_parallel_splits_the_decoder_tokens(seven_b: dict[str, Any]) -> None:
    from hyper_memory_profiler.estimate import BatchShape

    row = BatchShape(rows=1, seq_len=16384, samples=4, patches=4096, images=4)
    cp = ('--model.attn_implementation="varlen"',)
    one = _estimate(seven_b, 8, *cp, batch=row)
    split = _estimate(seven_b, 8, *cp, "--parallel.cp=2", batch=row)
    # FSDP2 shards over dp_shard (4) × cp (2): the same state per rank as 8 data shards
    assert (split.layout.dp_shard, split.layout.cp, split.layout.param_shards) == (4, 2, 8)
    assert split.rows["params"] == one.rows["params"]
    # each rank runs the decoder on half of the row, and the tower on half of its patches
    acts, half = one.activations, split.activations
    assert half["language_layers"] == acts["language_layers"] // 2
    assert half["vision_blocks"] == acts["vision_blocks"] // 2
    assert split.loss.rows == -(-one.loss.rows // 2)
    assert split.rows["activations"] < 0.6 * one.rows["activations"]


def test_cli_fits_or_not(seven_b: dict[str, Any], capsys: pytest.CaptureFixture[str]) -> None:
    from hyper_core.cli import main

    path: pathlib.Path = seven_b["path"]
    assert (
        main(
            [
                "memory",
                "estimate",
                str(path),
                "--nproc-per-node",
                "8",
                "--device-memory",
                "80GiB",
                "--json",
                '--parallel.param_dtype="float32"',  # fp32 gather: bf16 weight copies too
            ]
        )
        == 3  # does not fit
    )
    est = json.loads(capsys.readouterr().out)
    assert est["layout"]["dp_shard"] == 8 and est["fits"] is False
    assert est["per_rank"]["weight_copies"] > 0
    assert (
        main(
            [
                "memory",
                "estimate",
                str(path),
                "--nproc-per-node",
                "8",
                "--device-memory",
                "80GiB",
                "--training.activation_checkpointing=true",
                '--parallel.param_dtype="bfloat16"',
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert ": fits (" in out and "sharded over 8" in out


def test_each_checkpointing_policy_has_its_activation_bytes(seven_b: dict[str, Any]) -> None:
    ac = "--training.activation_checkpointing="
    acts = {
        p: _estimate(seven_b, 8, f'{ac}"{p}"') for p in ("none", "selective", "every_n", "full")
    }
    rows = {p: e.rows["activations"] for p, e in acts.items()}
    # selective (matmul outputs of every layer) may keep less than every_n with N = 2
    assert rows["none"] > rows["every_n"] > rows["full"] and rows["none"] > rows["selective"]
    assert rows["selective"] > rows["full"], rows
    assert acts["none"].transient["recompute"] == 0 < acts["selective"].transient["recompute"]
    # every_n with N = 1 is full; the vision tower takes its own policy
    one = _estimate(seven_b, 8, f'{ac}"every_n"', "--training.activation_checkpointing_every=1")
    assert one.activations["language_layers"] == acts["full"].activations["language_layers"]
    mixed = _estimate(
        seven_b, 8, f'{ac}"none"', '--training.vision_activation_checkpointing="full"'
    )
    assert mixed.activations["language_layers"] == acts["none"].activations["language_layers"]
    assert mixed.activations["vision_blocks"] == acts["full"].activations["vision_blocks"]


def test_estimate_recommends_the_cheapest_policy_that_fits(
    seven_b: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    from hyper_core.cli import main

    args = ["memory", "estimate", str(seven_b["path"]), "--nproc-per-node", "8"]
    totals = {}
    for p in ("none", "selective", "every_n", "full"):
        main([*args, "--json", f'--training.activation_checkpointing="{p}"'])
        totals[p] = json.loads(capsys.readouterr().out)["per_rank"]["total"]
    # a device between selective's and none's totals: selective is the one to pick
    device = int((totals["none"] + totals["selective"]) / 2)
    code = main([*args, "--json", "--headroom", "0", "--device-memory", str(device)])
    est = json.loads(capsys.readouterr().out)
    assert code == 3 and est["recommended_checkpointing"] == "selective"
    assert est["checkpointing_policies"] == totals
    # full fits too, but selective recomputes less: the table says so
    code = main(
        [
            *args,
            "--headroom",
            "0",
            "--device-memory",
            str(device),
            "--training.activation_checkpointing=true",
        ]
    )
    out = capsys.readouterr().out
    assert code == 0 and "recommended: activation_checkpointing = 'selective'" in out
    assert "'full' is not the cheapest that fits" in out
    # nothing fits a tiny device
    assert main([*args, "--headroom", "0", "--device-memory", "1GiB"]) == 3
    assert "no activation-checkpointing policy fits" in capsys.readouterr().out
