"""The ``hyper_train.plugins`` entry point: lazy registrations only (no torch/transformers)."""

from __future__ import annotations

from typing import Any

from hyper_core import hookimpl

_ADAPTERS = "hyper_qwen_vl.adapters"


@hookimpl
def register_model_adapters(register: Any) -> None:
    """``qwen2_vl``, ``qwen2_5_vl``, ``qwen3_vl`` and ``qwen3_vl_moe``."""
    register("qwen2_vl", f"{_ADAPTERS}:Qwen2VLAdapter", aliases=["Qwen2VLForConditionalGeneration"])
    register(
        "qwen2_5_vl",
        f"{_ADAPTERS}:Qwen25VLAdapter",
        aliases=["Qwen2_5_VLForConditionalGeneration"],
    )
    register("qwen3_vl", f"{_ADAPTERS}:Qwen3VLAdapter", aliases=["Qwen3VLForConditionalGeneration"])
    register(
        "qwen3_vl_moe",
        f"{_ADAPTERS}:Qwen3VLMoeAdapter",
        aliases=["Qwen3VLMoeForConditionalGeneration"],
    )
