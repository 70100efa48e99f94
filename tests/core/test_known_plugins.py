"""The one table of first-party plugins: true to what each distribution registers, and used by
the adapter, strategy and config-section hints."""

from __future__ import annotations

from importlib.metadata import entry_points

import pytest

from hyper_core.errors import PluginError
from hyper_core.known_plugins import FIRST_PARTY, FirstParty
from hyper_core.registry import Registries, Registry
from hyper_core.testing import isolated_host


def plugin_modules(distribution: str) -> list[str]:
    return [
        ep.value
        for ep in entry_points(group="hyper_train.plugins")
        if ep.dist is not None and ep.dist.metadata["Name"] == distribution
    ]


@pytest.mark.parametrize("first_party", FIRST_PARTY, ids=lambda p: p.distribution)
def test_each_entry_is_what_its_distribution_registers(first_party: FirstParty) -> None:
    modules = plugin_modules(first_party.distribution)
    assert modules, f"{first_party.distribution} is not installed"
    registries = isolated_host(modules).registries
    for name in first_party.adapters:
        assert _has(registries.model_adapters, name), name
    for name in first_party.strategies:
        assert _has(registries.parallel_strategies, name), name
    for name in first_party.sections:
        assert name in registries.config_sections, name


def _has(registry: Registry[object], name: str) -> bool:
    try:
        registry.entry(name)
    except PluginError:
        return False
    return True


def test_hints_of_all_three_kinds_come_from_the_table(monkeypatch: pytest.MonkeyPatch) -> None:
    from hyper_core import known_plugins
    from hyper_core.config import load_config_dict
    from hyper_core.errors import ConfigError

    extra = known_plugins.FirstParty(
        distribution="hyper-train-extra",
        adapters=("extra_vl",),
        strategies=("extra_parallel",),
        sections=("extra_section",),
    )
    monkeypatch.setattr(known_plugins, "FIRST_PARTY", (*known_plugins.FIRST_PARTY, extra))
    registries = Registries()
    with pytest.raises(PluginError, match="pip install hyper-train-extra"):
        registries.model_adapters.entry("Extra-VL")
    with pytest.raises(PluginError, match="pip install hyper-train-extra"):
        registries.parallel_strategies.entry("extra_parallel")
    with pytest.raises(ConfigError, match="pip install hyper-train-extra"):
        load_config_dict({"model": {"adapter": "hf_causal_lm"}, "extra_section": {}})
