"""The Gemma 3 adapter passes the plugin-author conformance suite."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

from hyper_core.testing.conformance_suite import AdapterConformance


class TestGemma3Conformance(AdapterConformance):
    adapter = "gemma3"
    distributed = True
    # Packed rows need `varlen`: transformers' own packed mask indexes the image blocks of
    # sliding-window layers by per-sample position (wrong past a row's first sample).
    tiny_config: ClassVar[str | Mapping[str, Any]] = {
        "config": "tiny",
        "attn_implementation": "varlen",
    }
