"""QLoRA (``[peft] quantize = "nf4"``): the frozen linear layers of the language model in
torchao's NF4, the adapters and their AdamW state in fp32.

Equivalence: LoRA on the NF4 base trains as LoRA on a base whose weights are the NF4 weights
dequantized (same losses, gradient norms and adapters); a resumed QLoRA run is the
uninterrupted one; chat and ``export --merge`` give the trained model's logits."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from peft_helpers import hyper_train, load, lora_config, train, write_text_model_dir, write_toml

from hyper_core.cli import main
from hyper_core.errors import ConfigError

NF4 = {"method": "lora", "r": 8, "quantize": "nf4"}
IDS = torch.arange(3, 40)[None]


def _logits(model: Any) -> torch.Tensor:
    with torch.no_grad():
        return model.eval()(input_ids=IDS).logits


def _is_nf4(param: Any) -> bool:
    from torchao.quantization import NF4Tensor

    return isinstance(param, NF4Tensor)


@pytest.fixture(scope="module")
def base_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_text_model_dir(tmp_path_factory.mktemp("base"))


@pytest.fixture(scope="module")
def dequantized_dir(base_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``base_dir``'s model with each weight the run quantizes replaced by its NF4 values
    (quantized and dequantized by the plugin's own functions)."""
    from transformers import AutoModelForCausalLM

    from hyper_core.plugins import get_plugin_host
    from hyper_core.resolve import resolve_adapter
    from hyper_peft.export import merge_lora
    from hyper_peft.lora import apply_lora
    from hyper_peft.quantize import dequantize_base, quantize_base

    config = load(lora_config(Path("unused"), peft=NF4))
    adapter = resolve_adapter(config.model, get_plugin_host().registries)
    model = AutoModelForCausalLM.from_pretrained(str(base_dir))
    apply_lora(model, adapter, config.section("peft"))
    assert quantize_base(model, adapter)
    assert dequantize_base(model) == 14  # q, k, v, o, gate, up, down of both layers
    merge_lora(model)  # lora_B = 0: the base layers back, unchanged
    out = tmp_path_factory.mktemp("dequantized") / "hf"
    adapter.export_hf(
        model.state_dict(), model.config, out, assets=adapter.build_assets(config.model)
    )
    return out


def test_a_qlora_run_has_an_nf4_base_and_learns(tmp_path: Path) -> None:
    run = train(lora_config(tmp_path, training={"steps": 6, "lr": 1e-2}, peft=NF4))
    model = run.trainer.unwrapped_model
    nf4 = {n for n, p in model.named_parameters() if _is_nf4(p)}
    assert len(nf4) == 14 and all(n.endswith(".base_layer.weight") for n in nf4)
    # the embedding (tied output head), norms and biases stay in [model] dtype
    others = {str(p.dtype) for n, p in model.named_parameters() if n not in nf4}
    assert others == {"torch.float32"}
    states = [s for s in run.trainer.optimizer.state.values() if "exp_avg" in s]
    assert states and all(s["exp_avg"].dtype == torch.float32 for s in states)
    assert len(states) == sum(p.requires_grad for p in model.parameters())
    assert run.losses[-1] < run.losses[0] - 0.2, run.losses


@pytest.mark.parametrize("mixed_precision", ["no", "bf16"])
def test_lora_on_nf4_trains_as_lora_on_the_dequantized_base(
    tmp_path: Path, base_dir: Path, dequantized_dir: Path, mixed_precision: str
) -> None:
    training = {"steps": 3, "lr": 1e-2, "mixed_precision": mixed_precision}
    runs = []
    for name, path, peft in [
        ("nf4", base_dir, NF4),
        ("dequantized", dequantized_dir, {"method": "lora", "r": 8}),
    ]:
        raw = lora_config(tmp_path / name, training=training, peft=peft)
        raw["model"] = {"adapter": "hf_causal_lm", "path": str(path)}
        runs.append(train(raw))
    nf4, ref = runs
    # fp32 compute is exact to rounding; bf16 autocast adds each bias after its product
    tol = 1e-5 if mixed_precision == "no" else 1e-2
    torch.testing.assert_close(torch.tensor(nf4.losses), torch.tensor(ref.losses), rtol=tol, atol=0)
    norms = [[m["grad_norm"] for m in r.metrics if "grad_norm" in m] for r in runs]
    torch.testing.assert_close(torch.tensor(norms[0]), torch.tensor(norms[1]), rtol=tol, atol=0)
    if mixed_precision == "no":  # under bf16 AdamW's near-zero steps may differ in sign
        trained = dict(ref.trainer.unwrapped_model.named_parameters())
        for name, param in nf4.trainer.unwrapped_model.named_parameters():
            if param.requires_grad:
                torch.testing.assert_close(param, trained[name], rtol=1e-4, atol=1e-6)


def test_a_resumed_qlora_run_is_the_uninterrupted_run(tmp_path: Path) -> None:
    sections = {
        "training": {"lr_scheduler": "constant", "lr": 1e-2},
        "checkpoint": {"every_steps": 2},
        "peft": NF4,
    }
    straight = train(lora_config(tmp_path / "straight", **sections), steps=4)
    raw = lora_config(tmp_path / "split", **sections)
    train(raw, steps=2)
    raw["checkpoint"] = {**raw["checkpoint"], "resume": "auto"}
    resumed = train(raw, steps=4)
    assert [m["step"] for m in resumed.metrics if "loss" in m][-2:] == [3, 4]
    assert resumed.losses[-2:] == straight.losses[2:]
    ref = dict(straight.trainer.unwrapped_model.named_parameters())
    for name, param in resumed.trainer.unwrapped_model.named_parameters():
        if param.requires_grad:
            assert torch.equal(param, ref[name]), name


def test_chat_and_merge_of_a_qlora_checkpoint_give_the_trained_logits(
    tmp_path: Path, base_dir: Path
) -> None:
    from transformers import AutoModelForCausalLM

    from hyper_core.inference import load_chat_model
    from hyper_core.plugins import get_plugin_host
    from hyper_peft.quantize import dequantize_base

    raw = lora_config(tmp_path / "run", training={"steps": 2, "lr": 2e-2}, peft=NF4)
    raw["model"] = {"adapter": "hf_causal_lm", "path": str(base_dir)}
    run = train(raw)
    config = write_toml(raw, tmp_path / "run" / "config.toml")
    model = run.trainer.unwrapped_model
    trained = _logits(model)
    # chat rebuilds the NF4 base: the very model that trained
    loaded = load_chat_model(tmp_path / "run", get_plugin_host(), device="cpu")
    assert sum(_is_nf4(p) for p in loaded.model.parameters()) == 14
    assert torch.equal(_logits(loaded.model), trained)
    # --merge: the dequantized base with the adapters merged, as plain fp32 weights
    out = tmp_path / "merged"
    argv = ["export", str(tmp_path / "run"), "--out", str(out), "--config", str(config)]
    assert main([*argv, "--merge"]) == 0
    merged = AutoModelForCausalLM.from_pretrained(str(out))
    assert {p.dtype for p in merged.parameters()} == {torch.float32}
    dequantize_base(model)
    assert (_logits(merged) - trained).abs().max() <= 1e-5
    assert torch.equal(_logits(model), trained)  # dequantizing changes no value


def test_quantize_errors_name_the_key(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ConfigError, match=r"\$\.peft\.quantize"):
        load(lora_config(tmp_path, peft={**NF4, "quantize": "int4"}))
    raw = lora_config(tmp_path, peft=NF4)
    del raw["peft"]["method"]
    with pytest.raises(ConfigError, match=r"\$\.peft\.method: not set, so \[peft\] .*quantize"):
        load(raw)
    import hyper_peft.config

    real = hyper_peft.config.importlib.util.find_spec
    monkeypatch.setattr(
        hyper_peft.config.importlib.util,
        "find_spec",
        lambda name, *a: None if name == "torchao" else real(name, *a),
    )
    with pytest.raises(ConfigError) as err:
        load(lora_config(tmp_path, peft=NF4))
    assert str(err.value).endswith(
        "$.peft.quantize: nf4 needs torchao, which is not installed; "
        "pip install 'hyper-train-peft[qlora]'"
    )


def test_nf4_on_several_ranks_is_a_config_error(tmp_path: Path) -> None:
    from types import SimpleNamespace

    from hyper_peft.plugin import build_callbacks

    config = load(lora_config(tmp_path, parallel={"strategy": "fsdp2"}, peft=NF4))
    with pytest.raises(
        ConfigError,
        match=r"\$\.peft\.quantize: nf4 runs on one process only, "
        r'not on 2 ranks \(\[parallel\] strategy = "fsdp2"\)',
    ):
        build_callbacks(config=config, dist=SimpleNamespace(world_size=2))
    assert build_callbacks(config=config, dist=SimpleNamespace(world_size=1)) is not None


def test_a_bad_quantize_is_exit_2(tmp_path: Path) -> None:
    toml = write_toml(lora_config(tmp_path / "out"), tmp_path / "run.toml")
    proc = hyper_train(["config", "validate", str(toml), '--peft.quantize="int4"'])
    assert proc.returncode == 2, proc.stderr[-2000:]
    errors = [line for line in proc.stderr.splitlines() if line.startswith("hyper-train: error")]
    assert len(errors) == 1 and "$.peft.quantize" in errors[0] and "nf4" in errors[0], errors
    assert "Traceback" not in proc.stderr
