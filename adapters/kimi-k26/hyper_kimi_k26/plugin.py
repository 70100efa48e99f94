"""The ``hyper_train.plugins`` entry point: lazy registrations only (no torch/transformers).

Registers the ``kimi_k25`` adapter (aliases ``kimi_k26``, ``KimiK25ForConditionalGeneration``,
``KimiK26ForConditionalGeneration``; the registry strips the suffix and ``_``), and logs the
MoE router statistics of a Kimi run with each logged step (``moe/*`` keys of
``metrics.jsonl``, see :mod:`hyper_kimi_k26.moe`).
"""

from __future__ import annotations

import sys
from typing import Any

from hyper_core import hookimpl

_ADAPTER = "hyper_kimi_k26.adapter"


@hookimpl
def register_model_adapters(register: Any) -> None:
    """``kimi_k25`` and its aliases."""
    register(
        "kimi_k25",
        f"{_ADAPTER}:KimiK25Adapter",
        aliases=[
            "kimi_k26",
            "KimiK25ForConditionalGeneration",
            "KimiK26ForConditionalGeneration",
        ],
    )


def _kimi_adapter(trainer: Any) -> Any:
    """The run's adapter if it is a Kimi one (its module is imported by then), else None."""
    module = sys.modules.get(_ADAPTER)
    adapter = getattr(trainer, "adapter", None)
    if module is None or not isinstance(adapter, module.KimiK25Adapter):
        return None
    return adapter


@hookimpl
def on_train_begin(trainer: Any, state: Any) -> None:
    """Hook the MoE routers of a Kimi model (device-side counters, no sync per step)."""
    adapter = _kimi_adapter(trainer)
    if adapter is not None:
        adapter.install_router_stats(trainer.unwrapped_model)


@hookimpl
def on_log(trainer: Any, state: Any, metrics: dict[str, Any]) -> None:
    """Add ``moe/load_max``, ``moe/load_min``, ``moe/load_cv``, ``moe/balance``,
    ``moe/dead_experts`` over the steps since the last log (a collective on every rank)."""
    adapter = _kimi_adapter(trainer)
    if adapter is not None:
        metrics.update(adapter.router_metrics(trainer.dist))
