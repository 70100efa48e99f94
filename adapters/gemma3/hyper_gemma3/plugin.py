"""The ``hyper_train.plugins`` entry point: lazy registrations only (no torch/transformers)."""

from __future__ import annotations

from typing import Any

from hyper_core import hookimpl


@hookimpl
def register_model_adapters(register: Any) -> None:
    """``gemma3``; a checkpoint whose config.json names the class finds it too."""
    register(
        "gemma3",
        "hyper_gemma3.adapter:Gemma3Adapter",
        aliases=["Gemma3ForConditionalGeneration"],
    )
