"""The four Qwen-VL adapters pass the plugin-author conformance suite (2-rank fsdp2 on one)."""

from __future__ import annotations

from hyper_core.testing.conformance_suite import AdapterConformance


class TestQwen2VL(AdapterConformance):
    adapter = "qwen2_vl"


class TestQwen25VL(AdapterConformance):
    adapter = "qwen2_5_vl"
    distributed = True


class TestQwen3VL(AdapterConformance):
    adapter = "qwen3_vl"


class TestQwen3VLMoe(AdapterConformance):
    adapter = "qwen3_vl_moe"
