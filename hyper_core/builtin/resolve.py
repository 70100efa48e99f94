"""Choosing components by registered name (never by import path)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ..errors import PluginError, UserError
from ..registry import Registries


def named(path: str, registry: Any, name: str) -> Any:
    try:
        return registry.get(name)
    except PluginError as exc:
        raise PluginError(f"{path}: {exc}") from exc


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


def resolve_runtime(
    config: Any, adapter: Any, assets: Any, registries: Registries, *, vision_filler: bool = False
) -> Any:
    """The batching runtime of ``[data] batching`` (default: the adapter's); with
    ``vision_filler``, it adds the adapter's vision filler to image-less micro-batches."""
    from ..attention import uses_varlen_kwargs
    from ..batching.base import BatchingOptions

    name = config.data.batching or adapter.default_batching
    cls = named("$.data.batching", registries.batching_runtimes, name)
    return cls(
        BatchingOptions(
            micro_batch_size=config.training.micro_batch_size,
            max_seq_len=config.data.max_seq_len,
            pad_token_id=assets.pad_token_id,
            varlen_kwargs=uses_varlen_kwargs(config.model.attn_implementation),
            vision_filler=adapter.vision_filler(assets) if vision_filler else None,
        )
    )


def resolve_strategy(config: Any, registries: Registries) -> Any:
    """The parallel strategy of ``[parallel] strategy``."""
    cls = named("$.parallel.strategy", registries.parallel_strategies, config.parallel.strategy)
    return cls(config.parallel, config.training)
