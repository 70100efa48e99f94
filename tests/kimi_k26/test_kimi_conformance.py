"""The Kimi-K2.5 adapter passes the plugin-author conformance suite, 2-rank fsdp2 included."""

from __future__ import annotations

from hyper_core.testing.conformance_suite import AdapterConformance


class TestKimiK25(AdapterConformance):
    adapter = "kimi_k25"
    distributed = True
