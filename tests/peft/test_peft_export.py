"""``hyper-train export`` of a LoRA run: the PEFT adapter directory that
``PeftModel.from_pretrained`` loads, and ``--merge``'s full model for ``from_pretrained``, both
giving the trained model's logits; clear errors otherwise."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from peft_helpers import lora_config, train, write_text_model_dir, write_toml

from hyper_core.cli import main

IDS = torch.arange(3, 40)[None]


def _logits(model: Any) -> torch.Tensor:
    with torch.no_grad():
        return model.eval()(input_ids=IDS).logits


def _export(run_dir: Path, config: Path, out: Path, *extra: str) -> int:
    return main(["export", str(run_dir), "--out", str(out), "--config", str(config), *extra])


@pytest.fixture(scope="module")
def base_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_text_model_dir(tmp_path_factory.mktemp("base"))


@pytest.mark.parametrize("method", ["lora", "dora"])
def test_adapter_dir_and_merge_give_the_trained_logits(
    tmp_path: Path, base_dir: Path, method: str
) -> None:
    from peft import PeftModel
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    raw = lora_config(
        tmp_path / "run",
        training={"lr": 2e-2},
        peft={"method": method, "modules_to_save": ["model.norm"]},
    )
    raw["model"] = {"adapter": "hf_causal_lm", "path": str(base_dir)}
    run = train(raw, steps=3)
    trained = _logits(run.trainer.unwrapped_model)
    base = _logits(AutoModelForCausalLM.from_pretrained(str(base_dir)))
    assert (trained - base).abs().max() > 0.1  # the adapters changed the model
    config = write_toml(raw, tmp_path / "run.toml")

    assert _export(tmp_path / "run", config, tmp_path / "adapter") == 0
    files = sorted(p.name for p in (tmp_path / "adapter").iterdir())
    assert files == [
        "README.md",
        "adapter_config.json",
        "adapter_model.safetensors",
        "chat_template.jinja",
        "hyper_train.json",
        "hyper_train.toml",
        "tokenizer.json",
        "tokenizer_config.json",
    ]
    recorded = json.loads((tmp_path / "adapter" / "adapter_config.json").read_text())
    assert recorded["base_model_name_or_path"] == str(base_dir.resolve())
    saved = load_file(str(tmp_path / "adapter" / "adapter_model.safetensors"))
    trainable = [n for n, p in run.trainer.unwrapped_model.named_parameters() if p.requires_grad]
    assert len(saved) == len(trainable)  # the adapters and model.norm, nothing of the base
    assert "base_model.model.model.norm.weight" in saved
    loaded = PeftModel.from_pretrained(
        AutoModelForCausalLM.from_pretrained(str(base_dir)), str(tmp_path / "adapter")
    )
    assert (_logits(loaded) - trained).abs().max() <= 1e-5

    assert _export(tmp_path / "run", config, tmp_path / "merged", "--merge") == 0
    merged = AutoModelForCausalLM.from_pretrained(str(tmp_path / "merged"))
    assert not any("lora" in n or "base_layer" in n for n, _ in merged.named_parameters())
    assert (_logits(merged) - trained).abs().max() <= 1e-5


def test_merge_of_a_random_init_run_rebuilds_the_seeded_base(tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM

    raw = lora_config(tmp_path / "run", training={"lr": 2e-2}, peft={"target": ["q_proj"]})
    run = train(raw, steps=2)
    config = write_toml(raw, tmp_path / "run.toml")
    assert _export(tmp_path / "run", config, tmp_path / "merged", "--merge") == 0
    merged = AutoModelForCausalLM.from_pretrained(str(tmp_path / "merged"))
    assert (_logits(merged) - _logits(run.trainer.unwrapped_model)).abs().max() <= 1e-5


def test_export_errors_are_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from transformers import AutoModelForCausalLM

    raw = lora_config(tmp_path / "run", peft={"r": 4, "target": ["q_proj", "v_proj"]})
    train(raw, steps=1)
    # exported with another [peft] section than the one it was trained with
    for peft, message in [
        (
            {"r": 8},
            "holds model.layers.0.self_attn.q_proj.lora_A.default.weight with shape (4, 64)",
        ),
        ({"target": ["k_proj"]}, "lacks 4 of the 4 weights the run's [peft] section trains"),
    ]:
        other = lora_config(tmp_path / "run", peft={"r": 4, "target": ["q_proj", "v_proj"], **peft})
        config = write_toml(other, tmp_path / "other.toml")
        assert _export(tmp_path / "run", config, tmp_path / "out") == 2
        [line] = capsys.readouterr().err.strip().splitlines()
        assert line.startswith("hyper-train: error: ") and message in line, line
    # a tied module to save (the tiny model's lm_head is its embedding): only --merge
    tied = lora_config(tmp_path / "tied", peft={"r": 4, "modules_to_save": ["lm_head"]})
    tied_run = train(tied, steps=1)
    config = write_toml(tied, tmp_path / "tied.toml")
    assert _export(tmp_path / "tied", config, tmp_path / "out") == 2
    [line] = capsys.readouterr().err.strip().splitlines()
    assert "$.peft.modules_to_save: model.embed_tokens.weight is tied" in line, line
    assert _export(tmp_path / "tied", config, tmp_path / "tied-merged", "--merge") == 0
    merged = AutoModelForCausalLM.from_pretrained(str(tmp_path / "tied-merged"))
    assert (_logits(merged) - _logits(tied_run.trainer.unwrapped_model)).abs().max() <= 1e-5
    capsys.readouterr()
    # --merge of a full fine-tuning checkpoint
    full = lora_config(tmp_path / "full")
    del full["peft"]
    train(full, steps=1)
    config = write_toml(full, tmp_path / "full.toml")
    assert _export(tmp_path / "full", config, tmp_path / "out", "--merge") == 2
    [line] = capsys.readouterr().err.strip().splitlines()
    assert "--merge: " in line and "holds no adapters to merge" in line, line
    assert not (tmp_path / "out").exists()


def test_export_hf_at_the_end_of_a_lora_run_writes_the_adapter_dir(
    tmp_path: Path, base_dir: Path
) -> None:
    """``[checkpoint] export_hf`` goes through the ``export_checkpoint`` hook: the PEFT adapter
    directory of the final checkpoint, not the LoRA-injected model's names as a full model."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    raw = lora_config(tmp_path / "run", training={"lr": 2e-2}, checkpoint={"export_hf": True})
    raw["model"] = {"adapter": "hf_causal_lm", "path": str(base_dir)}
    run = train(raw, steps=2)
    hf = tmp_path / "run" / "hf"
    files = sorted(p.name for p in hf.iterdir())
    assert files == [
        "README.md",
        "adapter_config.json",
        "adapter_model.safetensors",
        "chat_template.jinja",
        "hyper_train.json",
        "hyper_train.toml",
        "tokenizer.json",
        "tokenizer_config.json",
    ]
    recorded = json.loads((hf / "adapter_config.json").read_text())
    assert recorded["base_model_name_or_path"] == str(base_dir.resolve())
    trained = _logits(run.trainer.unwrapped_model)
    loaded = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(str(base_dir)), str(hf))
    assert (_logits(loaded) - trained).abs().max() <= 1e-5


def test_export_hf_of_a_lora_run_without_save_final_is_a_config_error(tmp_path: Path) -> None:
    """Without the final checkpoint there is nothing for the adapter export to read."""
    from hyper_core.errors import ConfigError

    raw = lora_config(tmp_path / "run", checkpoint={"export_hf": True, "save_final": False})
    with pytest.raises(ConfigError, match=r"\$\.checkpoint\.export_hf: .*save_final = false"):
        train(raw, steps=1)
    assert not (tmp_path / "run" / "hf").exists()
