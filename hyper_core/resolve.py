"""Choosing components by registered name (never by import path): the adapter of ``[model]``
and the strategy of ``[parallel]``. The batching runtime, which also needs the adapter's assets,
is chosen by :func:`hyper_core.batching.resolve.resolve_runtime`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import attrs

from .errors import PluginError, UserError
from .registry import Registries


def named(path: str, registry: Any, name: str) -> Any:
    try:
        return registry.get(name)
    except PluginError as exc:
        raise PluginError(f"{path}: {exc}") from exc


def dataset_format(path: str, registries: Registries, name: str) -> tuple[Any, type | None]:
    """The dataset format registered as ``name`` and its declared options class (or None)."""
    try:
        entry = registries.dataset_formats.entry(name)
        fmt = entry.load()
        options_class = entry.options_class()
    except PluginError as exc:
        raise PluginError(f"{path}: {exc}") from exc
    legacy = getattr(fmt, "options", None)
    if options_class is None and isinstance(legacy, type) and attrs.has(legacy):
        # Before register(..., options=Cls) a format declared its class as an attribute.
        raise PluginError(
            f"{path}: dataset format {name!r} (plugin {entry.plugin!r}) declares its options as "
            f"`{getattr(fmt, '__name__', name)}.options`; register it with "
            f"register({entry.name!r}, ref, options={legacy.__name__}) instead"
        )
    return fmt, options_class


def resolve_adapter(model_config: Any, registries: Registries) -> Any:
    """The adapter named by ``[model] adapter``, or found from ``path``/config.json."""
    if model_config.adapter is not None:
        return named("$.model.adapter", registries.model_adapters, model_config.adapter)()
    if model_config.path is None:
        raise UserError("$.model.adapter: required when [model] path is not set")
    config_file = Path(model_config.path) / "config.json"
    try:
        hf = json.loads(config_file.read_text())
    except FileNotFoundError as exc:
        raise UserError(f"$.model.path: {config_file} does not exist") from exc
    except json.JSONDecodeError as exc:
        raise UserError(f"$.model.path: {config_file} is not valid JSON: {exc}") from exc
    candidates = [hf.get("model_type"), *(hf.get("architectures") or [])]
    for name in candidates:
        if name and name in registries.model_adapters:
            return registries.model_adapters.get(name)()
    first = next((c for c in candidates if c), None)
    if first is None:
        raise UserError(f"$.model.path: {config_file} names no model_type; set [model] adapter")
    return named("$.model.adapter", registries.model_adapters, first)()


def strategy_class(config: Any, registries: Registries) -> Any:
    """The class registered as ``[parallel] strategy`` (what it can do, without building it)."""
    return named("$.parallel.strategy", registries.parallel_strategies, config.parallel.strategy)


def resolve_strategy(config: Any, registries: Registries) -> Any:
    """The parallel strategy of ``[parallel] strategy``."""
    return strategy_class(config, registries)(config.parallel, config.training)
