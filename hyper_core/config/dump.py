"""Writing a resolved config back as TOML, every default filled in."""

from __future__ import annotations

from typing import Any

from hyper_core.config.converter import converter
from hyper_core.config.schema import CORE_SECTIONS, Config


def config_to_dict(config: Config) -> dict[str, Any]:
    """The config as TOML-ready data: core sections, then plugin sections sorted by name.

    None values are left out (TOML has no null; None is every such field's default),
    ``async_save`` is written as ``async``, and a data source that is a plain ``.jsonl`` path
    is written as that string.
    """
    out = {name: converter.unstructure(getattr(config, name)) for name in CORE_SECTIONS}
    for name in sorted(config.plugin_sections):
        out[name] = converter.unstructure(config.plugin_sections[name])
    return out


def dump_config(config: Config) -> str:
    """The config as a TOML document that :func:`load_config_dict` reads back to an equal one."""
    import tomli_w

    return tomli_w.dumps(config_to_dict(config))
