"""The ``hyper_train.plugins`` entry point: lazy registrations only (no torch/transformers).

Registers the ``kimi_k25`` adapter (aliases ``kimi_k26``, ``KimiK25ForConditionalGeneration``,
``KimiK26ForConditionalGeneration``; the registry strips the suffix and ``_``), and logs the
MoE router statistics of a Kimi run with each logged step (``moe/*`` keys of
``metrics.jsonl``), through the run's own :class:`~hyper_kimi_k26.moe.RouterStatsRun`.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

from hyper_core import hookimpl

if TYPE_CHECKING:
    from .moe import RouterStatsRun

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


@hookimpl
def build_callbacks(adapter: Any) -> RouterStatsRun | None:
    """A Kimi run's :class:`~hyper_kimi_k26.moe.RouterStatsRun` (None for other adapters)."""
    module = sys.modules.get(_ADAPTER)  # imported already when the run's adapter is Kimi
    if module is None or not isinstance(adapter, module.KimiK25Adapter):
        return None
    from .moe import RouterStatsRun

    return RouterStatsRun()
