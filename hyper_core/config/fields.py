"""Helpers for declaring config fields: help metadata, validators, and structuring a data
source's options into the class its format declares. Used by the schema, by dataset formats and
by plugins' config sections (``from hyper_core.config.fields import meta, at_least``)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import attrs

from hyper_core.config.converter import converter, show

Validator = Any


def meta(doc: str, *, key: str | None = None, toml: bool = True) -> dict[str, Any]:
    """Field metadata: ``help`` text, the TOML ``key`` if it differs, ``toml=False`` if not read."""
    metadata: dict[str, Any] = {"help": doc}
    if key is not None:
        metadata["key"] = key
    if not toml:
        metadata["toml"] = False
    return metadata


def _check_finite(value: Any) -> None:
    # nan fails every comparison, but inf passes ``>= bound``: both are rejected by name.
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"must be a finite number, got {show(value)}")


def at_least(bound: float) -> Validator:
    """Validator: the value (when not None) is finite and ``>= bound``."""

    def check(_inst: Any, _attr: attrs.Attribute, value: Any) -> None:
        _check_finite(value)
        if value is not None and not value >= bound:
            raise ValueError(f"must be >= {show(bound)}, got {show(value)}")

    return check


def greater_than(bound: float) -> Validator:
    """Validator: the value (when not None) is finite and ``> bound``."""

    def check(_inst: Any, _attr: attrs.Attribute, value: Any) -> None:
        _check_finite(value)
        if value is not None and not value > bound:
            raise ValueError(f"must be > {show(bound)}, got {show(value)}")

    return check


def between(low: float, high: float) -> Validator:
    """Validator: ``low <= value <= high`` (a finite value)."""

    def check(_inst: Any, _attr: attrs.Attribute, value: Any) -> None:
        _check_finite(value)
        if value is not None and not low <= value <= high:
            raise ValueError(f"must be between {show(low)} and {show(high)}, got {show(value)}")

    return check


def not_empty(_inst: Any, _attr: attrs.Attribute, value: Any) -> None:
    """Validator: a string is not empty."""
    if value is not None and not value.strip():
        raise ValueError("must not be empty")


def format_options(options_class: type | None, options: Mapping[str, Any], where: str) -> Any:
    """A data source's options as its format takes them: an instance of the format's declared
    ``options`` attrs class (validated like the config, :class:`ConfigError` naming
    ``WHERE.KEY``), or the dict itself for a format that declares none."""
    if options_class is None:
        return dict(options)
    return converter.structure_at(dict(options), options_class, where)
