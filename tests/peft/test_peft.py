"""The peft plugin in one process: what is trainable, what changes, learning, checkpoints,
resume, and bad configs."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from peft_helpers import (
    hyper_train,
    load,
    lora_config,
    train,
    write_adapter_dir,
    write_text_model_dir,
    write_toml,
)

from hyper_core import hookimpl
from hyper_core.errors import ConfigError


def test_plugin_module_imports_no_torch() -> None:
    code = (
        "import sys\n"
        "import hyper_peft.plugin, hyper_peft.config\n"
        "assert 'torch' not in sys.modules and 'peft' not in sys.modules, 'heavy import'\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


def _built(raw: dict[str, Any]) -> tuple[Any, Any, Any]:
    """(config, adapter, model) of the tiny text run, the model built on the CPU, no LoRA."""
    from hyper_core.plugins import get_plugin_host
    from hyper_core.resolve import resolve_adapter

    config = load(raw)
    adapter = resolve_adapter(config.model, get_plugin_host().registries)
    return config, adapter, adapter.build_model(config.model, device="cpu")


def _trainable(model: Any) -> int:
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


@pytest.mark.parametrize(
    ("target", "peft_target"),
    [
        ("all-linear", "all-linear"),
        (["language"], "all-linear"),
        (["q_proj", "v_proj"], ["q_proj", "v_proj"]),
        (["language", "mlp.*_proj"], r".*\.mlp\..*_proj"),
    ],
)
def test_trainable_count_is_peft_own_count(tmp_path: Path, target: Any, peft_target: Any) -> None:
    from peft import LoraConfig, get_peft_model

    from hyper_peft.lora import apply_lora

    raw = lora_config(tmp_path, peft={"target": target})
    config, adapter, model = _built(raw)
    apply_lora(model, adapter, config.section("peft"))
    _, _, reference = _built(raw)
    reference = get_peft_model(reference, LoraConfig(r=8, target_modules=peft_target))
    want, total = reference.get_nb_trainable_parameters()
    assert _trainable(model) == want > 0
    assert sum(p.numel() for p in model.parameters()) == total


class Snapshot:
    """Keeps a copy of the model's parameters as ``build_model`` returned it (LoRA injected)."""

    def __init__(self) -> None:
        self.params: dict[str, Any] = {}

    @hookimpl
    def on_stage_end(self, stage: str, result: Any) -> None:
        if stage == "build_model":
            self.params = {n: p.detach().clone() for n, p in result.named_parameters()}


def test_only_lora_parameters_change(tmp_path: Path) -> None:
    snap = Snapshot()
    run = train(lora_config(tmp_path, peft={"modules_to_save": ["lm_head"]}), (snap,), steps=20)
    model = run.trainer.model
    after = dict(model.named_parameters())
    changed = {n for n, p in after.items() if not p.detach().equal(snap.params[n])}
    trainable = {n for n, p in after.items() if p.requires_grad}
    # Every LoRA B starts at zero and must have moved; the base is bit-identical.
    assert {n for n in after if "lora_B" in n} <= changed
    assert changed <= trainable
    # modules_to_save: the head, tied to the embeddings in tiny-qwen2 (one parameter).
    assert {n for n in trainable if ".lora_" not in n} == {"model.embed_tokens.weight"}
    assert "model.embed_tokens.weight" in changed
    base = [n for n in after if n not in trainable]
    assert base and all(after[n].detach().equal(snap.params[n]) for n in base)
    # Only the trainable parameters have optimizer state.
    with_state = {id(p) for p in run.trainer.optimizer.state}
    assert with_state == {id(after[n]) for n in trainable}


def test_lora_learns(tmp_path: Path) -> None:
    losses = train(lora_config(tmp_path, training={"lr": 2e-2}), steps=20).losses
    assert len(losses) == 20
    # The first loss is ln(vocab)-like (~6.96); LoRA alone brings it well under (~6.5).
    assert sum(losses[-5:]) / 5 < losses[0] - 0.3, losses


def _size(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def test_resume_is_exact_and_checkpoints_are_small(tmp_path: Path) -> None:
    # r=4 on q/v: on the tiny model (mostly embeddings) all-linear r=8 is ~1/3 of the weights.
    sections = {
        "training": {"lr_scheduler": "constant"},
        "checkpoint": {"every_steps": 3},
        "peft": {"r": 4, "target": ["q_proj", "v_proj"]},
    }
    straight = train(lora_config(tmp_path / "straight", **sections), steps=6).losses
    raw = lora_config(tmp_path / "split", **sections)
    train(raw, steps=3)
    raw["checkpoint"] = {**raw["checkpoint"], "resume": "auto"}
    resumed = train(raw, steps=6)
    assert [m["step"] for m in resumed.metrics if "loss" in m][-3:] == [4, 5, 6]
    assert resumed.losses[-3:] == straight[3:]
    lora = _size(tmp_path / "split" / "checkpoints" / "step-3")
    full_raw = lora_config(tmp_path / "full", **sections)
    del full_raw["peft"]
    train(full_raw, steps=3)
    full = _size(tmp_path / "full" / "checkpoints" / "step-3")
    assert lora < 0.1 * full, (lora, full)


def test_init_from_starts_from_the_adapter_weights(tmp_path: Path) -> None:
    from safetensors.torch import load_file

    hf = write_text_model_dir(tmp_path / "model")
    adapter = write_adapter_dir(hf, tmp_path / "adapter", r=4)
    saved = load_file(str(adapter / "adapter_model.safetensors"))
    raw = lora_config(tmp_path / "out", peft={"r": 4, "init_from": str(adapter)})
    raw["model"] = {"adapter": "hf_causal_lm", "path": str(hf)}
    snap = Snapshot()
    train(raw, (snap,), steps=1)
    lora = {n: p for n, p in snap.params.items() if ".lora_" in n}
    assert len(lora) == len(saved) > 0
    for name, value in lora.items():
        key = "base_model.model." + name.replace(".default.", ".")
        assert value.equal(saved[key]), name
    assert any(v.abs().sum() > 0 for k, v in lora.items() if "lora_B" in k)


def test_init_from_with_another_rank_is_a_config_error(tmp_path: Path) -> None:
    hf = write_text_model_dir(tmp_path / "model")
    adapter = write_adapter_dir(hf, tmp_path / "adapter", r=4)
    raw = lora_config(tmp_path / "out", peft={"r": 8, "init_from": str(adapter)})
    raw["model"] = {"adapter": "hf_causal_lm", "path": str(hf)}
    with pytest.raises(ConfigError, match=r"\$\.peft\.init_from: .* has shape .*another r"):
        train(raw, steps=1)


def test_sharded_load_reads_the_base_and_leaves_lora_to_the_plugin(tmp_path: Path) -> None:
    """The sharded-load path on one process: the checkpoint view loads the base weights under
    their checkpoint names, LoRA stays on meta until init_lora_shards."""
    import torch
    from transformers import AutoModelForCausalLM

    from hyper_core.parallel.env import DistEnv
    from hyper_core.parallel.hf_load import load_hf_shards
    from hyper_core.parallel.materialize import materialize_buffers
    from hyper_peft.lora import apply_lora
    from hyper_peft.sharded import checkpoint_view, init_lora_shards

    hf = write_text_model_dir(tmp_path / "model")
    raw = lora_config(tmp_path / "out")
    raw["model"] = {"adapter": "hf_causal_lm", "path": str(hf)}
    config, adapter, _ = _built(raw)
    model = adapter.build_model(config.model, device="meta")
    apply_lora(model, adapter, config.section("peft"))
    materialize_buffers(model, torch.device("cpu"))
    conversions = adapter.checkpoint_conversions(model)
    dist = DistEnv(device=torch.device("cpu"))
    load_hf_shards(model, hf, dist, conversions, view=checkpoint_view)
    params = dict(model.named_parameters())
    assert all(p.is_meta == (".lora_" in n) for n, p in params.items())
    reference = AutoModelForCausalLM.from_pretrained(str(hf))
    q = model.model.layers[0].self_attn.q_proj
    assert torch.equal(q.base_layer.weight, reference.model.layers[0].self_attn.q_proj.weight)
    init_lora_shards(model, 0, torch.device("cpu"), None)
    assert not any(p.is_meta for p in model.parameters())
    assert q.lora_A["default"].weight.abs().sum() > 0
    assert torch.equal(q.lora_B["default"].weight, torch.zeros_like(q.lora_B["default"].weight))
    ids = torch.arange(3, 20)[None]
    with torch.no_grad():  # B = 0: the model is the base
        assert torch.equal(model(input_ids=ids).logits, reference(input_ids=ids).logits)


def test_bad_values_name_the_key(tmp_path: Path) -> None:
    for key, value in [("r", 0), ("dropout", 1.0), ("target", []), ("method", "ia3")]:
        with pytest.raises(ConfigError, match=rf"\$\.peft\.{key}"):
            load(lora_config(tmp_path, peft={key: value}))
    with pytest.raises(ConfigError, match=r"\$\.peft\.alpah.*did you mean 'alpha'"):
        load(lora_config(tmp_path, peft={"alpah": 8}))
    # Keys without a method would silently train in full.
    raw = lora_config(tmp_path, peft={"r": 16})
    del raw["peft"]["method"]
    with pytest.raises(ConfigError, match=r"\$\.peft\.method: not set, so \[peft\] r would"):
        load(raw)
    raw["peft"] = {}
    assert not load(raw).section("peft").enabled


@pytest.mark.parametrize(
    ("peft", "message"),
    [
        ({"r": 0}, "$.peft.r: must be >= 1, got 0"),
        (
            {"target": ["q_prj"]},
            "$.peft.target: 'q_prj' matches no module of the model; did you mean 'q_proj'?",
        ),
        (
            {"target": ["vision"]},
            "$.peft.target: adapter 'hf_causal_lm' has no 'vision' part (available: language)",
        ),
    ],
)
def test_bad_config_is_exit_2(tmp_path: Path, peft: dict[str, Any], message: str) -> None:
    raw = lora_config(tmp_path / "out")
    toml = write_toml(raw, tmp_path / "run.toml")
    overrides = [f"--peft.{k}={v!r}".replace("'", '"') for k, v in peft.items()]
    proc = hyper_train(["run", str(toml), *overrides])
    assert proc.returncode == 2, proc.stderr[-2000:]
    errors = [line for line in proc.stderr.splitlines() if line.startswith("hyper-train: error")]
    assert len(errors) == 1 and errors[0].endswith(message), proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
