"""Resolving ``[peft] target`` to module names and injecting LoRA with peft, in place.

peft's ``inject_adapter_in_model`` replaces each targeted layer by a LoRA layer that holds the
original as ``base_layer``: the model keeps its class and module paths (the adapter's parallel
plan, freeze groups and loss still apply), only the targeted weights move to
``NAME.base_layer.weight``. Every parameter is then frozen but the adapters' and those of
``modules_to_save``.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from hyper_core.config.converter import did_you_mean
from hyper_core.errors import ConfigError

from .config import ALL_LINEAR, PARTS, PeftConfig

#: The adapter name peft registers the layers under.
ADAPTER = "default"
#: Parameter-name marker of peft's LoRA/DoRA tensors.
LORA_MARK = ".lora_"


def _matches(name: str, pattern: str) -> bool:
    """Whether the module ``name`` is ``pattern`` or ends with ``.pattern`` (``*`` allowed)."""
    return fnmatch.fnmatchcase(name, pattern) or fnmatch.fnmatchcase(name, f"*.{pattern}")


def _in_scope(name: str, scopes: list[str] | None) -> bool:
    return scopes is None or any(not s or name == s or name.startswith(f"{s}.") for s in scopes)


def _part_scopes(model: Any, adapter: Any, parts: list[str], where: str) -> list[str] | None:
    """The module paths of the named parts, or None (the whole model) when none is named."""
    if not parts:
        return None
    available = adapter.freeze_groups(model)
    scopes: list[str] = []
    for part in parts:
        if part not in available:
            raise ConfigError(
                [
                    (
                        where,
                        f"adapter {adapter.name!r} has no {part!r} part "
                        f"(available: {', '.join(sorted(available)) or 'none'})",
                    )
                ]
            )
        scopes.extend(available[part])
    return scopes


def _named(names: Iterable[str], patterns: list[str], where: str) -> list[str]:
    """The module names matching any pattern; a pattern matching none is an error."""
    names = list(names)
    found: list[str] = []
    for pattern in patterns:
        hits = [n for n in names if _matches(n, pattern)]
        if not hits:
            leaves = sorted({n.rsplit(".", 1)[-1] for n in names if n})
            raise ConfigError(
                [
                    (
                        where,
                        f"{pattern!r} matches no module of the model"
                        + did_you_mean(pattern.rsplit(".", 1)[-1], leaves),
                    )
                ]
            )
        found.extend(h for h in hits if h not in found)
    return found


def resolve_targets(model: Any, adapter: Any, cfg: PeftConfig) -> list[str]:
    """The full names of the modules LoRA goes into (``$.peft.target`` errors otherwise)."""
    import torch

    where = "$.peft.target"
    entries = cfg.targets
    parts = [e for e in entries if e in PARTS]
    patterns = [e for e in entries if e not in PARTS and e != ALL_LINEAR]
    scopes = _part_scopes(model, adapter, parts, where)
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    modules = {n: m for n, m in model.named_modules() if n and _in_scope(n, scopes)}
    if patterns:
        names = _named(modules, patterns, where)
    else:
        names = [n for n, m in modules.items() if isinstance(m, torch.nn.Linear) and m is not head]
    if not names:
        raise ConfigError([(where, f"no linear layer in {', '.join(parts) or 'the model'}")])
    return names


def saved_modules(model: Any, cfg: PeftConfig) -> list[str]:
    """The full names of the modules ``modules_to_save`` names (``$.peft.modules_to_save``)."""
    return _named(
        (n for n, _ in model.named_modules()), cfg.modules_to_save, "$.peft.modules_to_save"
    )


def apply_lora(model: Any, adapter: Any, cfg: PeftConfig) -> list[str]:
    """Inject LoRA into ``model`` (in place, on its device: CPU or meta) and leave only the
    adapters and ``modules_to_save`` trainable. Returns the targeted module names."""
    from peft import LoraConfig, inject_adapter_in_model

    targets = resolve_targets(model, adapter, cfg)
    to_save = saved_modules(model, cfg)
    lora = LoraConfig(
        r=cfg.r,
        lora_alpha=cfg.alpha,
        lora_dropout=cfg.dropout,
        target_modules=targets,
        use_dora=cfg.method == "dora",
    )
    try:
        inject_adapter_in_model(lora, model, adapter_name=ADAPTER)
    except (ValueError, TypeError) as exc:  # e.g. a targeted module type peft cannot adapt
        raise ConfigError([("$.peft.target", str(exc).splitlines()[0])]) from None
    for name, param in model.named_parameters():
        param.requires_grad_(LORA_MARK in name)
    for name in to_save:
        model.get_submodule(name).requires_grad_(True)
    if cfg.base_dtype is not None:
        cast_base(model, cfg.base_dtype)
    return targets


def cast_base(model: Any, base_dtype: str) -> None:
    """Frozen floating-point parameters to ``base_dtype``, trainable ones to fp32 (in place, on
    any device, meta included; tied parameters are one tensor). Buffers (rotary frequencies)
    keep their dtype."""
    import torch

    base = getattr(torch, base_dtype)
    for param in model.parameters():
        if param.is_floating_point():
            param.data = param.data.to(torch.float32 if param.requires_grad else base)


def read_adapter_weights(path: Path) -> dict[str, Any]:
    """The tensors of the PEFT adapter directory ``path`` (``$.peft.init_from`` errors)."""
    from peft.utils import load_peft_weights

    if not path.is_dir():
        raise ConfigError([("$.peft.init_from", f"not a directory: {path}")])
    try:
        return load_peft_weights(str(path), device="cpu")
    except (OSError, ValueError) as exc:
        raise ConfigError([("$.peft.init_from", f"{path}: {exc}")]) from None


def load_adapter_weights(model: Any, path: Path) -> None:
    """Copy the LoRA weights of the PEFT adapter directory ``path`` into ``model``."""
    import torch

    saved = read_adapter_weights(path)
    lora = {n: p for n, p in model.named_parameters() if LORA_MARK in n}
    missing = [n for n in lora if saved_name(n) not in saved]
    if missing:
        raise ConfigError(
            [("$.peft.init_from", f"{path} lacks {len(missing)} LoRA weight(s), e.g. {missing[0]}")]
        )
    with torch.no_grad():
        for name, param in lora.items():
            value = saved[saved_name(name)]
            if value.shape != param.shape:
                raise ConfigError(
                    [
                        (
                            "$.peft.init_from",
                            f"{path}: {saved_name(name)} has shape {tuple(value.shape)}, "
                            f"the model's is {tuple(param.shape)} (another r?)",
                        )
                    ]
                )
            param.copy_(value)


def saved_name(name: str) -> str:
    """The key of a trainable parameter in ``adapter_model.safetensors`` (PeftModel's layout:
    no adapter name, DoRA's magnitude without ``.weight``, ``modules_to_save`` as they are)."""
    name = name.replace(f".lora_magnitude_vector.{ADAPTER}.weight", ".lora_magnitude_vector")
    return "base_model.model." + name.replace(f".{ADAPTER}.", ".").removesuffix(f".{ADAPTER}")
