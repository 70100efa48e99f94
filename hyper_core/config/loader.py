"""Loading configs: TOML file → overrides applied → strictly structured :class:`Config`."""

from __future__ import annotations

import copy
import functools
import os
import pathlib
import re
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

import attrs

from hyper_core.config.converter import (
    converter,
    describe,
    join_key,
    show,
    toml_fields,
    unknown_key_message,
)
from hyper_core.config.fields import format_options
from hyper_core.config.schema import CORE_SECTIONS, Config, DataSource, SectionSpec
from hyper_core.errors import ConfigError, PluginError
from hyper_core.known_plugins import known_distributions
from hyper_core.registry import Registries, Registry, SectionTable

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

KNOWN_PLUGIN_SECTIONS: dict[str, str] = known_distributions("sections")
"""Sections of first-party plugins, by the distribution that provides them (a view of the one
table, :mod:`hyper_core.known_plugins`)."""

T = TypeVar("T")

_OVERRIDE_KEY = re.compile(r"[A-Za-z0-9_-]+")


def load_config(
    path: str | os.PathLike[str],
    overrides: Sequence[str] = (),
    sections: Mapping[str, SectionSpec] | None = None,
    *,
    registries: Registries | None = None,
) -> Config:
    """Read the TOML file at ``path``, apply ``--key.path=value`` overrides, and validate.

    ``registries`` (a plugin host's, ``host.registries``) give the plugin config sections and
    the dataset formats whose declared options classes check ``[data] train``/``eval``;
    ``sections`` alone is the older form (a host's ``registries.config_sections`` carries its
    formats too). Without either, plugin sections are unknown keys and format options are
    left to the run, which checks them when it reads the data.

    Raises :class:`ConfigError` (every problem, with its ``$.path``) for a missing or unreadable
    file, a TOML syntax error (with its line), a bad override or an invalid config.
    """
    source = os.fspath(path)
    parsed_overrides = parse_overrides(overrides)
    raw = read_toml(source)
    raw = apply_overrides(raw, parsed_overrides)
    return _build(raw, source, os.path.abspath(source), _Known.of(sections, registries))


def read_toml(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Parse a TOML file; any failure is a :class:`ConfigError` naming the file."""
    source = os.fspath(path)
    try:
        text = pathlib.Path(source).read_bytes().decode("utf-8")
    except FileNotFoundError:
        raise ConfigError("config file not found", source=source) from None
    except IsADirectoryError:
        raise ConfigError("is a directory, not a config file", source=source) from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"not UTF-8 text: {exc}", source=source) from None
    except OSError as exc:
        raise ConfigError(f"cannot read: {exc.strerror or exc}", source=source) from None
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        msg = str(exc)
        if "at end of document" in msg:
            msg = msg.replace("at end of document", f"at end of document, line {_last_line(text)}")
        raise ConfigError(f"invalid TOML: {msg}", source=source) from None


def _last_line(text: str) -> int:
    return max(1, text.count("\n") + (0 if text.endswith("\n") else 1))


def parse_overrides(args: Sequence[str]) -> dict[str, Any]:
    """Parse ``--a.b=value`` / ``a.b=value`` arguments into ``{"a.b": value}``.

    Values are TOML values (``1e-4``, ``true``, ``"x"``, ``[1, 2]``, ``{ k = 1 }``); anything that
    is not a valid TOML value is taken as a string, so ``--run.name=demo`` works unquoted.
    Later arguments win. Raises :class:`ConfigError` listing every malformed argument.
    """
    problems: list[tuple[str, str]] = []
    out: dict[str, Any] = {}
    for arg in args:
        text = arg[2:] if arg.startswith("--") else arg
        key, sep, value = text.partition("=")
        key = key.strip()
        parts = key.split(".")
        if not key or not all(_OVERRIDE_KEY.fullmatch(p) for p in parts):
            problems.append((arg, "malformed override: expected --KEY.PATH=VALUE"))
            continue
        if not sep:
            problems.append((_path_of(parts), f"override has no value; write --{key}=VALUE"))
            continue
        out.pop(key, None)
        out[key] = parse_value(value)
    _raise_if_any(problems, "command line")
    return out


def parse_value(text: str) -> Any:
    """A TOML value, or the text itself when it is not one."""
    text = text.strip()
    try:
        parsed = tomllib.loads(f"v = {text}")
    except tomllib.TOMLDecodeError:
        return text
    return parsed["v"] if parsed.keys() == {"v"} else text


def _path_of(parts: Sequence[str]) -> str:
    path = "$"
    for part in parts:
        path = join_key(path, part)
    return path


def apply_overrides(raw: Mapping[str, Any], overrides: Mapping[str, Any]) -> dict[str, Any]:
    """A deep copy of ``raw`` with each ``{"a.b.c": value}`` set, creating missing tables."""
    out = copy.deepcopy(dict(raw))
    problems: list[tuple[str, str]] = []
    for dotted, value in overrides.items():
        parts = dotted.split(".")
        table = out
        for depth, part in enumerate(parts[:-1]):
            child = table.setdefault(part, {})
            if not isinstance(child, dict):
                problems.append(
                    (
                        _path_of(parts[: depth + 1]),
                        f"is {describe(child)}, not a table, so it cannot take the override "
                        f"{dotted}={show(value)}",
                    )
                )
                break
            table = child
        else:
            table[parts[-1]] = copy.deepcopy(value)
    _raise_if_any(problems, "command line")
    return out


def _raise_if_any(problems: list[tuple[str, str]], source: str | None) -> None:
    if problems:
        raise ConfigError(problems, source=source)


def load_config_dict(
    data: Mapping[str, Any],
    source: str | None = None,
    sections: Mapping[str, SectionSpec] | None = None,
    *,
    registries: Registries | None = None,
) -> Config:
    """Validate an already-parsed config (``source``: the file it came from, if any).

    ``registries`` and ``sections`` as for :func:`load_config`. Raises :class:`ConfigError`
    with every problem found.
    """
    return _build(data, source, source, _Known.of(sections, registries))


@attrs.frozen
class _Known:
    """What validating a config needs from the plugins: their sections by name, the installed
    distributions whose plugins were not loaded (-> why, so a section of one is not answered
    with "pip install"), and the dataset formats."""

    sections: Mapping[str, SectionSpec]
    unavailable: Mapping[str, str]
    formats: Registry[Any] | None

    @classmethod
    def of(
        cls, sections: Mapping[str, SectionSpec] | None, registries: Registries | None
    ) -> _Known:
        if registries is not None:
            if sections is not None:
                raise TypeError("pass registries or sections, not both")
            sections = registries.config_sections
        if isinstance(sections, SectionTable):
            return cls(dict(sections), sections.unavailable, sections.dataset_formats)
        return cls(dict(sections or {}), {}, None)


def _build(
    data: Mapping[str, Any],
    source: str | None,
    source_path: str | None,
    plugins: _Known,
) -> Config:
    sections, unavailable, formats = plugins.sections, plugins.unavailable, plugins.formats
    known = known_distributions("sections")
    _check_specs(sections)
    if not isinstance(data, Mapping):
        raise ConfigError(f"expected a table, got {describe(data)}", source=source)
    problems: list[tuple[str, str]] = []
    core: dict[str, Any] = {}
    for key, value in data.items():
        if key in CORE_SECTIONS:
            core[key] = value
            continue
        if key in sections:
            continue
        if key in known and known[key] in unavailable:
            dist = known[key]
            msg = f"section of plugin {dist}, which is installed but {unavailable[dist]}"
        elif key in known:
            msg = f"section of a plugin that is not installed; pip install {known[key]}"
        else:
            msg = unknown_key_message(str(key), [*CORE_SECTIONS, *sections])
        problems.append((join_key("$", key), msg))
    config = _collect(problems, functools.partial(converter.structure_at, core, Config))
    plugin_sections: dict[str, object] = {}
    for name, spec in sections.items():
        if name not in data and not _all_defaulted(spec.cls):
            continue
        structure = functools.partial(
            converter.structure_at, data.get(name, {}), spec.cls, join_key("$", name)
        )
        value = _collect(problems, structure)
        if value is not None:
            plugin_sections[name] = value
    _check_format_options(problems, core.get("data"), formats)
    _raise_if_any(problems, source)
    assert config is not None
    return attrs.evolve(config, plugin_sections=plugin_sections, source_path=source_path)


def _collect(problems: list[tuple[str, str]], structure: Callable[[], T]) -> T | None:
    """``structure()``, or None with its ConfigError's problems added to ``problems``."""
    try:
        return structure()
    except ConfigError as exc:
        problems.extend(exc.problems)
        return None


def _check_format_options(
    problems: list[tuple[str, str]], data: Any, formats: Registry[Any] | None
) -> None:
    """Validate the ``[data] train``/``eval`` options in ``data`` (the raw table) with their
    formats' declared classes, also when other keys have problems (one pass reports all).

    Without the formats registry nothing is checked here; a format it does not know is left to
    the run, which names it.
    """
    if not isinstance(data, Mapping) or formats is None:
        return
    for key in ("train", "eval"):
        raw = data.get(key)
        items = raw if isinstance(raw, list) else [] if raw is None else [raw]
        for index, item in enumerate(items):
            where = f"$.data.{key}[{index}]" if isinstance(raw, list) else f"$.data.{key}"
            try:
                source = converter.structure(item, DataSource)
            except ConfigError:
                continue  # reported with the rest of the config
            if source.format not in formats:
                continue
            try:
                options_class = formats.entry(source.format).options_class()
            except (ImportError, AttributeError, PluginError):
                continue  # options that do not import are reported by the run, which needs them
            _collect(
                problems, functools.partial(format_options, options_class, source.options, where)
            )


def _check_specs(sections: Mapping[str, SectionSpec]) -> None:
    for name, spec in sections.items():
        if name in CORE_SECTIONS:
            raise PluginError(
                f"plugin {spec.plugin!r} registers config section {name!r}, a core section"
            )
        if not (isinstance(spec.cls, type) and attrs.has(spec.cls)):
            raise PluginError(
                f"plugin {spec.plugin!r} registers config section {name!r} with "
                f"{spec.cls!r}, which is not an attrs class"
            )


def _all_defaulted(cls: type) -> bool:
    return all(f.default is not attrs.NOTHING for f in toml_fields(cls).values())


def resolve_path(config: Config, path: str | os.PathLike[str]) -> pathlib.Path:
    """A data path as the config means it: relative to the config file's directory.

    Absolute paths (and ``~``) are kept; without a source file, relative to the working
    directory. (``run.output_dir`` is relative to the working directory: don't use this for it.)
    """
    p = pathlib.Path(path).expanduser()
    if p.is_absolute() or config.source_path is None:
        return p
    return pathlib.Path(config.source_path).parent / p
