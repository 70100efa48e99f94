"""The plugin module named by the ``hyper_train.plugins`` entry point."""

from __future__ import annotations

from typing import Any

from hyper_core.hookspecs import hookimpl


@hookimpl
def register_model_adapters(register: Any) -> None:
    """``llava``; a checkpoint whose config.json says ``llava`` or the class name finds it."""
    # A lazy "module:Class" reference: `hyper-train plugins` stays fast (no torch import).
    register("llava", "hyper_llava.adapter:LlavaAdapter", aliases=["LlavaForConditionalGeneration"])
