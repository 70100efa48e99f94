"""Test helpers for hyper-train and for plugin authors' own repositories.

Also a pytest plugin (``pytest11`` entry point ``hyper_train``) exposing the fixtures in
:mod:`hyper_core.testing.pytest_plugin`; :mod:`hyper_core.testing.processes` runs the CLI and
torchrun in subprocesses with a clean rank environment.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import attrs

from ..hookspecs import BUILD_STAGES, LIFECYCLE_EVENTS, hookimpl


def tiny_text_config(output_dir: str | os.PathLike[str], **sections: Mapping[str, Any]) -> dict:
    """A raw config dict for a tiny text run (``hf_causal_lm`` ``tiny-qwen2``).

    Keyword arguments update sections: ``tiny_text_config(d, training={"steps": 3})``. The
    data is the text demo's, written into the cache on first use (works from any install).
    """
    from ..demo.text import ensure_text_demo

    cfg: dict[str, Any] = {
        "run": {"output_dir": str(output_dir), "seed": 0},
        "model": {"adapter": "hf_causal_lm", "config": "tiny-qwen2"},
        "data": {
            "train": str(ensure_text_demo("train")),
            "max_seq_len": 128,
            "batching": "packed",
        },
        "training": {
            "steps": 5,
            "global_batch_size": 8,
            "micro_batch_size": 4,
            "lr": 3e-3,
            "warmup_steps": 0,
        },
        "logging": {"every_steps": 1, "progress": "none"},
        "checkpoint": {"resume": "none"},
    }
    for name, values in sections.items():
        cfg.setdefault(name, {}).update(values)
    return cfg


def isolated_host(plugins: Iterable[Any] = (), *, entry_points: bool = False) -> Any:
    """A plugin host with the core's built-ins and only the plugins given.

    ``plugins`` are importable module names or plugin objects (instances or modules).
    """
    from ..plugins.manager import PluginHost

    host = PluginHost(entry_points=entry_points, strict=True)
    for i, plugin in enumerate(plugins):
        if isinstance(plugin, str):
            host.add_module(plugin)
        else:
            host.add_object(plugin, name=f"test-plugin-{i}-{type(plugin).__name__}")
    return host


@attrs.define
class TinyRun:
    """What :func:`run_tiny_training` returns."""

    output_dir: Path
    metrics: list[dict[str, Any]]
    trainer: Any

    @property
    def losses(self) -> list[float]:
        """The logged train losses, in step order."""
        return [m["loss"] for m in self.metrics if "loss" in m]

    @property
    def eval_metrics(self) -> list[dict[str, Any]]:
        """The logged evaluations."""
        return [m["eval"] for m in self.metrics if "eval" in m]


def read_metrics(output_dir: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """The records of ``metrics.jsonl``."""
    path = Path(output_dir) / "metrics.jsonl"
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def run_tiny_training(
    config: Mapping[str, Any] | Any,
    *,
    plugins: Iterable[Any] = (),
    steps: int | None = None,
    host: Any = None,
) -> TinyRun:
    """Train in this process with only the given plugins; returns metrics and output dir.

    ``config`` is a raw dict (see :func:`tiny_text_config`) or a :class:`Config`.
    """
    from ..config import Config, load_config_dict
    from ..trainer.trainer import Trainer

    host = host or isolated_host(plugins)
    if not isinstance(config, Config):
        raw = {k: dict(v) if isinstance(v, Mapping) else v for k, v in config.items()}
        if steps is not None:
            raw["training"] = {**raw["training"], "steps": steps}
            raw["training"].pop("epochs", None)
        config = load_config_dict(raw, sections=host.registries.config_sections)
    trainer = Trainer(config, host)
    trainer.train()
    out = Path(config.run.output_dir)
    return TinyRun(output_dir=out, metrics=read_metrics(out), trainer=trainer)


class HookRecorder:
    """A plugin that records every build stage and lifecycle event it sees, in order."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, dict[str, Any]]] = []

    @property
    def names(self) -> list[str]:
        """The hook names called, in order."""
        return [name for name, _ in self.calls]


def _make_recorder_hooks() -> None:
    """Give :class:`HookRecorder` one implementation per hook, naming every spec argument
    (pluggy passes an implementation only the arguments its signature names)."""
    import inspect

    from .. import hookspecs

    for name in BUILD_STAGES + LIFECYCLE_EVENTS:
        args = list(inspect.signature(getattr(hookspecs, name)).parameters)
        record = f"self.calls.append(({name!r}, dict({', '.join(f'{a}={a}' for a in args)})))"
        if name in BUILD_STAGES:
            body = f"    {record}\n    return (yield)\n"
        else:
            body = f"    {record}\n"
        namespace: dict[str, Any] = {}
        exec(f"def {name}(self, {', '.join(args)}):\n{body}", namespace)
        marker = hookimpl(wrapper=True) if name in BUILD_STAGES else hookimpl
        setattr(HookRecorder, name, marker(namespace[name]))


_make_recorder_hooks()

__all__ = [
    "HookRecorder",
    "TinyRun",
    "isolated_host",
    "read_metrics",
    "run_tiny_training",
    "tiny_text_config",
]
