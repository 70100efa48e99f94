"""Named registries of components (adapters, batching runtimes, strategies, data formats).

Plugins register components by name through the ``register_*`` hooks. Names are normalised
(:func:`normalize_name`) so ``Qwen2_5_VL``, ``qwen2-5-vl`` and
``Qwen2_5_VLForConditionalGeneration`` are one key. References may be lazy ``"module:attr"``
strings: nothing is imported until the component is used, which keeps ``hyper-train --help``
and ``hyper-train plugins`` fast.
"""

from __future__ import annotations

import difflib
import importlib
import re
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, Generic, TypeVar

import attrs

from .errors import PluginError
from .known_plugins import known_distributions

T = TypeVar("T")

_SUFFIXES = ("forconditionalgeneration", "forcausallm")


def normalize_name(name: str) -> str:
    """Normalise a component name: lowercase, ``-``/``_``/``.`` removed, HF suffixes stripped."""
    key = re.sub(r"[-_.\s]", "", name).lower()
    for suffix in _SUFFIXES:
        if key.endswith(suffix) and len(key) > len(suffix):
            key = key[: -len(suffix)]
    return key


def import_ref(ref: str) -> Any:
    """Import a ``"package.module:attr.path"`` reference."""
    module_name, sep, attr_path = ref.partition(":")
    if not sep or not module_name or not attr_path:
        raise PluginError(f"bad reference {ref!r}: expected 'package.module:Name'")
    obj: Any = importlib.import_module(module_name)
    for part in attr_path.split("."):
        obj = getattr(obj, part)
    return obj


@attrs.define(kw_only=True)
class Entry(Generic[T]):
    """One registered component."""

    name: str
    ref: Any
    plugin: str
    aliases: tuple[str, ...] = ()
    overrides: str | None = None
    #: A dataset format's options: an attrs class or a lazy ``"module:Class"`` (None: a dict).
    options: Any = None
    _loaded: Any = attrs.field(default=None, alias="_loaded")

    def load(self) -> T:
        """Import (once) and return the registered object."""
        if self._loaded is None:
            self._loaded = import_ref(self.ref) if isinstance(self.ref, str) else self.ref
        return self._loaded

    def options_class(self) -> type | None:
        """The declared options class (imported on first use), or None."""
        return import_ref(self.options) if isinstance(self.options, str) else self.options

    @property
    def ref_name(self) -> str:
        """The reference as text, for listings."""
        if isinstance(self.ref, str):
            return self.ref
        return f"{getattr(self.ref, '__module__', '?')}:{getattr(self.ref, '__qualname__', '?')}"


class Registry(Generic[T]):
    """Components of one kind, by normalised name."""

    def __init__(
        self, kind: str, known: Mapping[str, str] | None = None, *, takes_options: bool = False
    ) -> None:
        """``known``: ``name -> distribution`` of first-party names, for "pip install" hints
        (see :mod:`hyper_core.known_plugins`); ``takes_options``: entries may declare an
        options class (dataset formats)."""
        self.kind = kind
        self.takes_options = takes_options
        self._entries: dict[str, Entry[T]] = {}  # canonical key -> entry
        self._keys: dict[str, str] = {}  # any normalised name/alias -> canonical key
        self._known = {normalize_name(n): d for n, d in (known or {}).items()}
        #: Installed distributions whose plugins were not loaded -> why (set by the host), so
        #: that a missing name they provide is not answered with "pip install".
        self.unavailable: dict[str, str] = {}

    def register(
        self,
        name: str,
        ref: Any,
        *,
        plugin: str,
        aliases: Iterable[str] = (),
        overrides: str | None = None,
        options: Any = None,
    ) -> None:
        """Add a component; a clash with another plugin's name is an error naming both.
        ``options`` (dataset formats only) is the attrs class, or ``"module:Class"``, that the
        component's options are structured into."""
        if options is not None and not self.takes_options:
            raise PluginError(f"{self.kind} {name!r}: only dataset formats declare options")
        entry: Entry[T] = Entry(
            name=name,
            ref=ref,
            plugin=plugin,
            aliases=tuple(aliases),
            overrides=overrides,
            options=options,
        )
        keys = [normalize_name(n) for n in (name, *entry.aliases)]
        for key in keys:
            other_key = self._keys.get(key)
            if other_key is None:
                continue
            other = self._entries[other_key]
            if other.plugin == plugin and other.name == name:
                continue  # the same registration twice (idempotent loading)
            if overrides is not None and normalize_name(overrides) == other_key:
                self._remove(other_key)
                continue
            if other.overrides is not None and normalize_name(other.overrides) == normalize_name(
                name
            ):
                return  # an already-registered override of this one wins
            raise PluginError(
                f"{self.kind} {key!r} is registered twice: as {other.name!r} by plugin "
                f"{other.plugin!r} and as {name!r} by plugin {plugin!r}; uninstall one, or "
                f"declare overrides={other.name!r} in the plugin that should win"
            )
        canonical = keys[0]
        self._entries[canonical] = entry
        for key in keys:
            self._keys[key] = canonical

    def _remove(self, canonical: str) -> None:
        self._entries.pop(canonical, None)
        for key in [k for k, v in self._keys.items() if v == canonical]:
            del self._keys[key]

    def __contains__(self, name: str) -> bool:
        return normalize_name(name) in self._keys

    def __iter__(self) -> Iterator[Entry[T]]:
        return iter(self._entries.values())

    def __len__(self) -> int:
        return len(self._entries)

    def names(self) -> list[str]:
        """Registered names (not aliases), sorted."""
        return sorted(e.name for e in self._entries.values())

    def entry(self, name: str) -> Entry[T]:
        """The entry for ``name`` or an alias; a :class:`PluginError` that helps otherwise."""
        key = normalize_name(name)
        canonical = self._keys.get(key)
        if canonical is None:
            raise PluginError(self._missing_message(name, key))
        return self._entries[canonical]

    def get(self, name: str) -> T:
        """Load and return the component registered as ``name``."""
        return self.entry(name).load()

    def _missing_message(self, name: str, key: str) -> str:
        installed = ", ".join(self.names()) or "none"
        msg = f"no {self.kind} named {name!r} (installed: {installed})"
        dist = self._known.get(key)
        if dist is not None and dist in self.unavailable:
            why = self.unavailable[dist]
            return f"{msg}; it is provided by {dist}, which is installed but {why}"
        if dist is not None:
            return f"{msg}; it is provided by {dist}: pip install {dist}"
        close = difflib.get_close_matches(key, list(self._keys), n=1)
        if close:
            msg += f"; did you mean {self._entries[self._keys[close[0]]].name!r}?"
        return msg


class SectionTable(dict[str, Any]):
    """Plugin config sections by name (name -> SectionSpec), with what loading a config needs
    besides: the installed distributions whose plugins were not loaded (-> why), so that a
    section of one is not answered with "pip install", and the dataset formats, whose declared
    option classes validate ``[data] train``/``eval``."""

    def __init__(self, dataset_formats: Registry[Any] | None = None) -> None:
        super().__init__()
        self.unavailable: dict[str, str] = {}
        self.dataset_formats = dataset_formats


@attrs.define
class Registries:
    """All registries of one plugin manager."""

    model_adapters: Registry[Any] = attrs.field(
        factory=lambda: Registry("model adapter", known_distributions("adapters"))
    )
    batching_runtimes: Registry[Any] = attrs.field(factory=lambda: Registry("batching runtime"))
    parallel_strategies: Registry[Any] = attrs.field(
        factory=lambda: Registry("parallel strategy", known_distributions("strategies"))
    )
    dataset_formats: Registry[Any] = attrs.field(
        factory=lambda: Registry("dataset format", takes_options=True)
    )
    config_sections: SectionTable = attrs.field(
        default=attrs.Factory(lambda self: SectionTable(self.dataset_formats), takes_self=True)
    )
    commands: dict[str, Any] = attrs.field(factory=dict)  # name -> CommandSpec

    def by_hook(self) -> dict[str, Registry[Any]]:
        """The named registries keyed by their registration hook."""
        return {
            "register_model_adapters": self.model_adapters,
            "register_batching_runtimes": self.batching_runtimes,
            "register_parallel_strategies": self.parallel_strategies,
            "register_dataset_formats": self.dataset_formats,
        }


@attrs.frozen
class CommandSpec:
    """A ``hyper-train`` subcommand, registered by a plugin (the core's too:
    :mod:`hyper_core.cli.plugin`)."""

    name: str
    add_arguments: Callable[[Any], None]
    run: Callable[[Any], int | None]
    help: str
    plugin: str
    description: str | None = None
