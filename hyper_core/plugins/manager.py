"""Loading plugins and collecting what they register.

Order (never discovery order): the core's built-in plugins, then the entry points of the group
``hyper_train.plugins`` sorted by name, then modules named with ``--plugin`` or
``[run] plugins``. Each entry point loads in its own ``try``: a failure is a one-line warning and
the plugin shows as ``failed`` in ``hyper-train plugins``, unless strict mode makes it fatal.
"""

from __future__ import annotations

import importlib
import importlib.metadata as md
import logging
import os
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import attrs
import pluggy

from .. import hookspecs
from ..errors import PluginError
from ..registry import CommandSpec, Registries
from .run_hooks import RunHooks

log = logging.getLogger("hyper_train.plugins")

ENTRY_POINT_GROUP = "hyper_train.plugins"
STRICT_ENV = "HYPER_TRAIN_STRICT_PLUGINS"
FILTER_ENV = "HYPER_TRAIN_PLUGINS"

#: The core's own plugins, one module per capability, registered through the same manager as
#: everyone else's (``hyper-train plugins`` lists them). The per-run objects' modules come last,
#: in reverse: pluggy calls the last registered first, so ``build_callbacks`` returns the
#: progress display, then the MoE statistics, then the step profiler (the order they are
#: registered for the run in).
BUILTIN_PLUGINS: tuple[str, ...] = (
    "hyper_core.builtin.components",
    "hyper_core.builtin.formats",
    "hyper_core.demo.plugin",
    "hyper_core.builtin.stages",
    "hyper_core.cli.plugin",
    "hyper_core.builtin.step_profiler",
    "hyper_core.builtin.moe_stats",
    "hyper_core.builtin.progress",
)


@attrs.define(kw_only=True)
class PluginRecord:
    """What ``hyper-train plugins`` shows about one plugin."""

    name: str
    module: str
    distribution: str | None = None
    version: str | None = None
    status: str = "loaded"  # loaded | builtin | failed | disabled
    error: str | None = None
    hooks: list[str] = attrs.field(factory=list)
    registers: dict[str, list[str]] = attrs.field(factory=dict)

    def to_json(self) -> dict[str, Any]:
        """A JSON-able dict."""
        return attrs.asdict(self)


def _strict_from_env() -> bool:
    return os.environ.get(STRICT_ENV, "").strip().lower() in {"1", "true", "yes", "on"}


def _filter_from_env() -> set[str] | None:
    raw = os.environ.get(FILTER_ENV)
    if raw is None:
        return None
    return {part.strip() for part in raw.split(",") if part.strip()}


class PluginHost:
    """A pluggy ``PluginManager`` with hyper-train's loading rules and registries."""

    def __init__(
        self,
        *,
        extra_modules: Sequence[str] = (),
        strict: bool | None = None,
        only: Iterable[str] | None = None,
        entry_points: bool = True,
        builtins: Sequence[str] = BUILTIN_PLUGINS,
    ) -> None:
        self.pm = pluggy.PluginManager(hookspecs.PROJECT_NAME)
        self.pm.add_hookspecs(hookspecs)
        self.strict = _strict_from_env() if strict is None else strict
        self.records: dict[str, PluginRecord] = {}
        self.registries = Registries()
        #: Per-run objects registered now, by plugin name -> the run that registered them.
        self._run_plugins: dict[str, RunHooks] = {}
        self._only = set(only) if only is not None else _filter_from_env()
        for module in builtins:
            self._register_module(module, name=module, status="builtin")
        if entry_points:
            self._load_entry_points()
        for module in extra_modules:
            self.add_module(module, collect=False)
        self.pm.check_pending()
        self._collect_registrations()

    # -- loading ------------------------------------------------------------------------------

    @property
    def hook(self) -> Any:
        """The pluggy hook relay (``host.hook.build_model(...)``)."""
        return self.pm.hook

    def _register_module(
        self, module: str, *, name: str, status: str, dist: md.Distribution | None = None
    ) -> None:
        obj = importlib.import_module(module)
        self._register_object(obj, name=name, module=module, status=status, dist=dist)

    def _register_object(
        self,
        obj: Any,
        *,
        name: str,
        module: str,
        status: str,
        dist: md.Distribution | None = None,
    ) -> None:
        if self.pm.is_registered(obj) or self.pm.has_plugin(name):
            return
        self.pm.register(obj, name=name)
        self.records[name] = PluginRecord(
            name=name,
            module=module,
            distribution=dist.metadata["Name"] if dist is not None else None,
            version=dist.version if dist is not None else None,
            status=status,
            hooks=sorted(impl_name for impl_name in self._hook_names(obj)),
        )

    def _hook_names(self, obj: Any) -> list[str]:
        return [
            caller.name
            for caller in self.pm.get_hookcallers(obj) or []
            if caller.name in self._spec_names()
        ]

    @staticmethod
    def _spec_names() -> set[str]:
        return set(
            hookspecs.BUILD_STAGES
            + hookspecs.LIFECYCLE_EVENTS
            + hookspecs.REGISTRATION_HOOKS
            + hookspecs.COMMAND_HOOKS
        )

    def _selected(self, ep: md.EntryPoint) -> bool:
        if self._only is None:
            return True
        dist_name = ep.dist.metadata["Name"] if ep.dist is not None else None
        return ep.name in self._only or (dist_name is not None and dist_name in self._only)

    def _load_entry_points(self) -> None:
        eps = sorted(md.entry_points(group=ENTRY_POINT_GROUP), key=lambda e: e.name)
        self._check_filter(eps)
        seen: set[str] = set()
        for ep in eps:
            if ep.name in seen:
                continue  # the same distribution visible twice on sys.path
            seen.add(ep.name)
            dist = ep.dist
            if not self._selected(ep):
                self.records[ep.name] = PluginRecord(
                    name=ep.name,
                    module=ep.value,
                    distribution=dist.metadata["Name"] if dist else None,
                    version=dist.version if dist else None,
                    status="disabled",
                )
                if dist is not None:
                    why = f"disabled by {FILTER_ENV}={os.environ.get(FILTER_ENV, '')!r}"
                    if self._only is not None and not self._only:
                        why += " (empty: no plugin loads)"
                    for registry in self.registries.by_hook().values():
                        registry.unavailable[dist.metadata["Name"]] = why
                    self.registries.config_sections.unavailable[dist.metadata["Name"]] = why
                continue
            try:
                obj = ep.load()
                self._register_object(
                    obj, name=ep.name, module=ep.value, status="loaded", dist=dist
                )
                self.pm.check_pending()
            except Exception as exc:
                self._failed(ep.name, ep.value, dist, exc)

    def _check_filter(self, eps: Sequence[md.EntryPoint]) -> None:
        """Warn about names in ``HYPER_TRAIN_PLUGINS`` that no installed plugin has."""
        if not self._only:
            return
        names = {ep.name for ep in eps}
        dists = {ep.dist.metadata["Name"] for ep in eps if ep.dist is not None}
        unknown = sorted(n for n in self._only if n not in names | dists)
        if unknown:
            log.warning(
                "%s names %s: no installed plugin is called so (installed: %s)",
                FILTER_ENV,
                ", ".join(repr(n) for n in unknown),
                ", ".join(sorted(names)) or "none",
            )

    def _failed(
        self, name: str, module: str, dist: md.Distribution | None, exc: BaseException
    ) -> None:
        if self.pm.has_plugin(name):
            self.pm.unregister(name=name)
        dist_name = dist.metadata["Name"] if dist is not None else "?"
        version = dist.version if dist is not None else "?"
        error = f"{type(exc).__name__}: {exc}".splitlines()[0]
        message = f"plugin {name!r} (distribution {dist_name} {version}) failed to load: {error}"
        if self.strict:
            raise PluginError(message) from exc
        log.warning("%s", message)
        self.records[name] = PluginRecord(
            name=name,
            module=module,
            distribution=None if dist is None else dist_name,
            version=None if dist is None else version,
            status="failed",
            error=error,
        )

    def add_module(self, module: str, *, collect: bool = True) -> None:
        """Register a plugin module by import name (``--plugin MODULE``); errors are fatal."""
        if self.pm.has_plugin(module):
            return
        try:
            self._register_module(module, name=module, status="loaded")
        except ImportError as exc:
            raise PluginError(f"--plugin {module}: cannot import: {exc}") from exc
        self.pm.check_pending()
        if collect:
            self._collect_registrations(only_plugin=module)

    def add_object(self, obj: Any, name: str) -> None:
        """Register an in-memory plugin object (tests, callbacks)."""
        self._register_object(obj, name=name, module=type(obj).__module__, status="loaded")
        self.pm.check_pending()
        self._collect_registrations(only_plugin=name)

    # -- registrations ------------------------------------------------------------------------

    def _impls(self, hook_name: str, only_plugin: str | None) -> list[Any]:
        impls = getattr(self.pm.hook, hook_name).get_hookimpls()
        # pluggy calls the last-registered first; registration should follow load order.
        ordered = list(reversed(impls))
        ordered.sort(
            key=lambda impl: (
                list(self.records).index(impl.plugin_name)
                if impl.plugin_name in self.records
                else len(self.records)
            )
        )
        return [i for i in ordered if only_plugin is None or i.plugin_name == only_plugin]

    def _call_impl(self, impl: Any, register: Callable[..., None]) -> None:
        try:
            impl.function(register=register)
        except PluginError:
            raise
        except Exception as exc:
            record = self.records.get(impl.plugin_name)
            dist = None
            if record is not None and record.distribution:
                try:
                    dist = md.distribution(record.distribution)
                except md.PackageNotFoundError:
                    dist = None
            if record is None or record.status == "builtin":
                raise
            self._failed(impl.plugin_name, record.module, dist, exc)

    def _collect_registrations(self, only_plugin: str | None = None) -> None:
        for hook_name, registry in self.registries.by_hook().items():
            for impl in self._impls(hook_name, only_plugin):
                plugin = impl.plugin_name

                def register(
                    name: str,
                    ref: Any,
                    *,
                    aliases: Iterable[str] = (),
                    overrides: str | None = None,
                    options: Any = None,
                    _plugin: str = plugin,
                    _registry: Any = registry,
                ) -> None:
                    _registry.register(
                        name,
                        ref,
                        plugin=_plugin,
                        aliases=aliases,
                        overrides=overrides,
                        options=options,
                    )
                    rec = self.records.get(_plugin)
                    if rec is not None:
                        names = rec.registers.setdefault(_registry.kind, [])
                        if name not in names:
                            names.append(name)

                self._call_impl(impl, register)
        for impl in self._impls("register_config_sections", only_plugin):
            self._call_impl(impl, self._section_registrar(impl.plugin_name))
        for impl in self._impls("register_commands", only_plugin):
            self._call_impl(impl, self._command_registrar(impl.plugin_name))

    def _section_registrar(self, plugin: str) -> Callable[..., None]:
        def register(name: str, cls: Any) -> None:
            from ..config import SectionSpec
            from ..registry import import_ref

            existing = self.registries.config_sections.get(name)
            if existing is not None and existing.plugin != plugin:
                raise PluginError(
                    f"config section [{name}] is registered twice: by plugin "
                    f"{existing.plugin!r} and by plugin {plugin!r}"
                )
            resolved = import_ref(cls) if isinstance(cls, str) else cls
            self.registries.config_sections[name] = SectionSpec(
                name=name, cls=resolved, plugin=plugin
            )
            self._note(plugin, "config section", name)

        return register

    def _command_registrar(self, plugin: str) -> Callable[..., None]:
        def register(
            name: str,
            add_arguments: Callable[[Any], None],
            run: Callable[[Any], Any],
            help: str = "",
            *,
            description: str | None = None,
        ) -> None:
            existing = self.registries.commands.get(name)
            if existing is not None and existing.plugin != plugin:
                raise PluginError(
                    f"command {name!r} is registered twice: by plugin {existing.plugin!r} "
                    f"and by plugin {plugin!r}"
                )
            self.registries.commands[name] = CommandSpec(
                name=name,
                add_arguments=add_arguments,
                run=run,
                help=help,
                plugin=plugin,
                description=description,
            )
            self._note(plugin, "command", name)

        return register

    def _note(self, plugin: str, kind: str, name: str) -> None:
        rec = self.records.get(plugin)
        if rec is not None:
            names = rec.registers.setdefault(kind, [])
            if name not in names:
                names.append(name)

    # -- calling ------------------------------------------------------------------------------

    def call_stage(self, stage: str, **kwargs: Any) -> Any:
        """Call a build stage with the keyword arguments its spec names."""
        return getattr(self.pm.hook, stage)(**kwargs)

    def fire(self, event: str, **kwargs: Any) -> None:
        """Fire a lifecycle event."""
        getattr(self.pm.hook, event)(**kwargs)

    # -- runs ---------------------------------------------------------------------------------

    def for_run(self) -> RunHooks:
        """A view of this host for one run: what it calls skips other runs' objects."""
        return RunHooks(self)

    def add_run_plugin(self, obj: Any, name: str, *, owner: RunHooks) -> None:
        """Register one run's object (:meth:`RunHooks.register`)."""
        self.pm.register(obj, name=name)
        self._run_plugins[name] = owner

    def remove_run_plugin(self, name: str) -> None:
        """Unregister one run's object, if still registered."""
        if self._run_plugins.pop(name, None) is not None and self.pm.has_plugin(name):
            self.pm.unregister(name=name)

    def run_plugin_names(self, *, exclude: RunHooks | None = None) -> set[str]:
        """Plugin names of the per-run objects registered now, but those of ``exclude``."""
        return {n for n, owner in list(self._run_plugins.items()) if owner is not exclude}


_HOSTS: dict[tuple[Any, ...], PluginHost] = {}


def get_plugin_host(extra_modules: Sequence[str] = (), *, strict: bool | None = None) -> PluginHost:
    """The process-wide plugin host for these options (loading is idempotent per process)."""
    key = (tuple(extra_modules), strict, os.environ.get(FILTER_ENV), _strict_from_env())
    host = _HOSTS.get(key)
    if host is None:
        host = PluginHost(extra_modules=extra_modules, strict=strict)
        _HOSTS[key] = host
    return host


def reset_plugin_host() -> None:
    """Forget cached hosts (tests)."""
    _HOSTS.clear()
