"""``memory estimate`` of a LoRA run (``[peft]``): frozen base weights have no gradients and
no optimizer state, the LoRA weights do; the estimate equals a profiled LoRA run's measured
state and reports peft's own trainable-parameter count."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from mp_helpers import PROFILER_ON, run_in_process, write_config

pytest.importorskip("hyper_peft")

PEFT = """
[peft]
method = "lora"
r = 8
dropout = 0.1
"""


@pytest.fixture(scope="module")
def lora_run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("lora")
    config = write_config(root / "lora.toml", root / "out", extra=PROFILER_ON + PEFT)
    trainer = run_in_process(config)
    summary = json.loads((root / "out" / "memory" / "summary.json").read_text())
    return {"config": config, "summary": summary, "trainer": trainer}


def _peft_own_count(trainer: Any) -> tuple[int, int]:
    """(trainable, total) of peft's ``get_peft_model`` on the run's base model."""
    from peft import LoraConfig, get_peft_model

    from hyper_peft.lora import resolve_targets

    adapter, cfg = trainer.adapter, trainer.config
    base = adapter.build_model(cfg.model, device="meta")
    targets = resolve_targets(base, adapter, cfg.section("peft"))
    reference = get_peft_model(base, LoraConfig(r=8, target_modules=targets))
    return reference.get_nb_trainable_parameters()


def test_estimate_of_a_lora_run_equals_its_measured_state(
    lora_run: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    from hyper_core.cli import main
    from hyper_memory_profiler.report import first_measured_step, measured_state

    record = lora_run["summary"]["ranks"][0]
    batch = first_measured_step(record)["batch"]
    argv = ["memory", "estimate", str(lora_run["config"]), "--json"]
    argv += ["--tokens", str(batch["rows"] * batch["seq_len"]), "--samples", str(batch["samples"])]
    argv += ["--patches", str(batch["patches"])]
    capsys.readouterr()
    assert main(argv) == 0
    est = json.loads(capsys.readouterr().out)
    measured = measured_state(record)
    for key in ("params", "grads", "optimizer", "buffers"):
        assert est["per_rank"][key] == measured[key]["total"], key
    trainable, total = _peft_own_count(lora_run["trainer"])
    assert est["parameters"]["trainable"] == trainable > 0
    assert est["parameters"]["total"] == total
    assert est["parameters"]["trainable_share"] == pytest.approx(trainable / total)
    # fp32: 4 B of gradient and 8 B of AdamW moments per trainable parameter, none for the base
    assert est["per_rank"]["grads"] == 4 * trainable
    n = sum(1 for p in lora_run["trainer"].unwrapped_model.parameters() if p.requires_grad)
    assert est["per_rank"]["optimizer"] == 8 * trainable + 4 * n
    assert est["activations"]["lora"] > 0  # lora_B's inputs, dropout masks and outputs
    # an upper bound: frozen norms and layers save less than the formula counts (1.32 here)
    acts = first_measured_step(record)["activations"]
    assert acts <= est["per_rank"]["activations"] <= 1.5 * acts


def test_estimate_table_shows_the_trainable_share(
    lora_run: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    from hyper_core.cli import main

    capsys.readouterr()
    assert main(["memory", "estimate", str(lora_run["config"])]) == 0
    trainable, total = _peft_own_count(lora_run["trainer"])
    line = f"parameters: {total:,}, trainable {trainable:,} ({100 * trainable / total:.2f}%)"
    assert line in capsys.readouterr().out.splitlines()


def test_lora_estimate_is_below_full_fine_tuning(tmp_path: Path) -> None:
    from hyper_core.config import load_config
    from hyper_core.plugins.manager import PluginHost
    from hyper_core.resolve import resolve_strategy
    from hyper_memory_profiler.estimate import estimate_config, layout_for

    host = PluginHost()
    full = write_config(tmp_path / "full.toml", tmp_path / "out")
    lora = write_config(tmp_path / "lora.toml", tmp_path / "out", extra=PEFT)
    rows = {}
    for name, path in (("full", full), ("lora", lora)):
        cfg = load_config(path, [], host.registries.config_sections)
        layout_for(cfg, resolve_strategy(cfg, host.registries), 1)
        rows[name] = estimate_config(cfg, host.registries, 1).rows
    assert rows["lora"]["params"] > rows["full"]["params"]  # the base plus the adapters
    assert rows["lora"]["grads"] < rows["full"]["grads"] / 3
    assert rows["lora"]["optimizer"] < rows["full"]["optimizer"] / 3


def _profiled_and_estimated(
    tmp_path: Path, name: str, extra: str, capsys: pytest.CaptureFixture[str]
) -> tuple[Any, dict[str, Any], dict[str, Any]]:
    """Train the tiny config with ``extra`` under the profiler, then estimate it at the batch
    the profiler measured: ``(trainer, estimate, measured state)``, after asserting that the
    estimate's per-rank state equals the measurement."""
    from hyper_core.cli import main
    from hyper_memory_profiler.report import first_measured_step, measured_state

    config = write_config(tmp_path / f"{name}.toml", tmp_path / "out", extra=extra)
    trainer = run_in_process(config)
    record = json.loads((tmp_path / "out" / "memory" / "summary.json").read_text())["ranks"][0]
    batch = first_measured_step(record)["batch"]
    argv = ["memory", "estimate", str(config), "--json"]
    argv += ["--tokens", str(batch["rows"] * batch["seq_len"]), "--samples", str(batch["samples"])]
    argv += ["--patches", str(batch["patches"])]
    capsys.readouterr()
    assert main(argv) == 0
    est = json.loads(capsys.readouterr().out)
    measured = measured_state(record)
    for key in ("params", "grads", "optimizer", "buffers"):
        assert est["per_rank"][key] == measured[key]["total"], key
    return trainer, est, measured


def test_a_bf16_base_is_measured_as_estimated(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``[peft] base_dtype = "bfloat16"``: the profiler measures the frozen base in bf16 and the
    LoRA weights, gradients and AdamW state in fp32, as the estimate counts them."""
    extra = PROFILER_ON + PEFT + 'base_dtype = "bfloat16"\n'
    _, est, _ = _profiled_and_estimated(tmp_path, "lora", extra, capsys)
    trainable = est["parameters"]["trainable"]
    by_dtype = est["state"]["params"]["by_dtype"]
    assert by_dtype == {
        "float32": 4 * trainable,
        "bfloat16": 2 * (est["parameters"]["total"] - trainable),
    }
    assert set(est["state"]["optimizer"]["by_dtype"]) == {"float32"}


def test_an_nf4_base_is_measured_as_estimated(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``[peft] quantize = "nf4"``: the profiler measures the NF4 weights' packed bytes (codes,
    block scales, factors) as the estimate counts them, ``n/2 + n/64 + e·n/(64·s) + 17·e`` per
    weight of ``n`` elements quantized from ``e``-byte values; the rest as without it."""
    from hyper_peft.quantize import dequantize_peak_bytes, nf4_bytes, nf4_modules

    extra = PROFILER_ON + PEFT + 'base_dtype = "bfloat16"\nquantize = "nf4"\n'
    trainer, est, measured = _profiled_and_estimated(tmp_path, "qlora", extra, capsys)
    model = trainer.unwrapped_model
    names = nf4_modules(model, trainer.adapter)
    assert names and not any("visual" in n for n in names)  # the vision tower stays bf16
    shapes = [model.get_submodule(n).weight.shape for n in names]
    packed = sum(nf4_bytes(s.numel(), 2) for s in shapes)
    by_dtype = est["state"]["params"]["by_dtype"]
    assert by_dtype["nf4"] == measured["params"]["by_dtype"]["nf4"] == packed
    assert packed < 0.6 * sum(s.numel() for s in shapes)  # ~0.52 byte per weight here
    trainable = est["parameters"]["trainable"]
    assert by_dtype["float32"] == 4 * trainable
    unpacked = est["parameters"]["total"] - trainable - sum(s.numel() for s in shapes)
    assert by_dtype["bfloat16"] == 2 * unpacked  # the vision tower, embeddings, norms
    largest = max(s.numel() for s in shapes)  # dequantized for its matmul
    assert est["transient"]["nf4_dequantize"] == dequantize_peak_bytes(largest, 2) == 14 * largest
