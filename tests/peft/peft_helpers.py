"""Helpers of the peft plugin's tests: tiny LoRA configs, in-process and CLI runs."""

from __future__ import annotations

import functools
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from hyper_core.testing import processes, tiny_text_config

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
DISTRIBUTED = REPO / "tests" / "distributed"

#: The CLI in a subprocess, with the installed plugins (entry points).
hyper_train = functools.partial(processes.hyper_train, timeout=120)


def lora_config(out: Path, **sections: Mapping[str, Any]) -> dict[str, Any]:
    """The tiny text run with ``[peft] method = "lora"``, r=8 on every linear layer."""
    cfg = tiny_text_config(out, peft={"method": "lora", "r": 8})
    for name, values in sections.items():
        cfg.setdefault(name, {}).update(values)
    return cfg


def load(raw: Mapping[str, Any]) -> Any:
    """A validated Config with the installed plugins' sections."""
    from hyper_core.config import load_config_dict
    from hyper_core.plugins import get_plugin_host

    return load_config_dict(dict(raw), sections=get_plugin_host().registries.config_sections)


def write_toml(raw: Mapping[str, Any], path: Path) -> Path:
    """Validate ``raw`` and write it as a TOML config file."""
    from hyper_core.config import dump_config

    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(dump_config(load(raw)))
    return path


def train(raw: Mapping[str, Any], plugins: tuple[Any, ...] = (), steps: int | None = None) -> Any:
    """Train in this process with the peft plugin (and ``plugins``); a ``TinyRun``."""
    from hyper_core.testing import run_tiny_training

    return run_tiny_training(raw, plugins=("hyper_peft.plugin", *plugins), steps=steps)


def write_text_model_dir(out: Path) -> Path:
    """The tiny text model (random init, seed 0) as an HF directory, with its tokenizer."""
    import torch

    from hyper_core.plugins import get_plugin_host
    from hyper_core.resolve import resolve_adapter

    config = load(tiny_text_config(out / "unused"))
    adapter = resolve_adapter(config.model, get_plugin_host().registries)
    torch.manual_seed(0)
    built = adapter.build_model(config.model)
    target = out / "hf"
    adapter.export_hf(
        built.state_dict(), built.config, target, assets=adapter.build_assets(config.model)
    )
    return target


def write_adapter_dir(model_dir: Path, out: Path, r: int) -> Path:
    """A PEFT adapter directory for the model of ``model_dir`` (LoRA r on every linear layer,
    B non-zero so that it changes the model), written by peft's own ``save_pretrained``."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(str(model_dir))
    model = get_peft_model(base, LoraConfig(r=r, lora_alpha=16, target_modules="all-linear"))
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.copy_(torch.randn(param.shape, generator=generator) * 0.05)
    model.save_pretrained(str(out))
    return out
