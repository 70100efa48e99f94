"""One run's view of a plugin host: the host's plugins plus the run's own per-run objects.

Per-run objects (what ``build_callbacks`` returns) are registered in the host's one pluggy
manager, so that pluggy orders and traces them like any plugin. Build stages and lifecycle
events called through a :class:`RunHooks` leave out every object another run registered: two
trainers may share a host, one after the other or at the same time.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pluggy

    from .manager import PluginHost


class RunHooks:
    """A :class:`~hyper_core.plugins.manager.PluginHost` as one run sees it (``host.for_run()``).

    It has the host's attributes (``registries``, ``records``...); :attr:`pm` is the host's
    pluggy manager except that its ``hook`` callers skip other runs' objects.
    """

    def __init__(self, host: PluginHost) -> None:
        self._host = host
        self.pm = _RunPluginManager(host.pm, self._hidden)
        #: Plugin names of this run's objects, in registration order.
        self.names: list[str] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self._host, name)

    @property
    def hook(self) -> _RunHookRelay:
        """The hook relay of this run (``hooks.hook.on_log(...)``)."""
        return self.pm.hook

    def _hidden(self) -> set[str]:
        return self._host.run_plugin_names(exclude=self)

    # -- per-run objects ----------------------------------------------------------------------

    def register(self, obj: Any) -> bool:
        """Register ``obj`` for this run only; False when it is registered already."""
        if self._host.pm.is_registered(obj):
            return False
        name = f"run-{id(self):x}-{type(obj).__name__}-{id(obj):x}"
        self._host.add_run_plugin(obj, name, owner=self)
        self.names.append(name)
        return True

    def unregister_all(self) -> None:
        """Unregister every object of this run (idempotent)."""
        for name in self.names:
            self._host.remove_run_plugin(name)
        self.names.clear()

    # -- calling ------------------------------------------------------------------------------

    def call_stage(self, stage: str, **kwargs: Any) -> Any:
        """Call a build stage with the keyword arguments its spec names."""
        return getattr(self.pm.hook, stage)(**kwargs)

    def fire(self, event: str, **kwargs: Any) -> None:
        """Fire a lifecycle event."""
        getattr(self.pm.hook, event)(**kwargs)


class _RunPluginManager:
    """The host's pluggy manager with a relay that skips the plugins ``hidden()`` names."""

    def __init__(self, pm: pluggy.PluginManager, hidden: Callable[[], set[str]]) -> None:
        self._pm = pm
        self.hook = _RunHookRelay(pm, hidden)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._pm, name)


class _RunHookRelay:
    def __init__(self, pm: pluggy.PluginManager, hidden: Callable[[], set[str]]) -> None:
        self._pm = pm
        self._hidden = hidden

    def __getattr__(self, name: str) -> _RunHookCaller:
        return _RunHookCaller(self._pm, getattr(self._pm.hook, name), self._hidden)


class _RunHookCaller:
    """One hook without other runs' implementations. (pluggy's ``subset_hook_caller`` would
    need hashable plugin objects, which attrs classes with ``eq`` are not.)"""

    def __init__(
        self, pm: pluggy.PluginManager, caller: pluggy.HookCaller, hidden: Callable[[], set[str]]
    ) -> None:
        self._pm = pm
        self._caller = caller
        self._hidden = hidden
        self.name = caller.name

    @property
    def spec(self) -> Any:
        """The hook's spec."""
        return self._caller.spec

    def get_hookimpls(self) -> list[pluggy.HookImpl]:
        """The implementations this run calls, in pluggy's list order."""
        hidden = self._hidden()
        return [i for i in self._caller.get_hookimpls() if i.plugin_name not in hidden]

    def __call__(self, **kwargs: Any) -> Any:
        spec = self._caller.spec
        firstresult = bool(spec.opts.get("firstresult", False)) if spec is not None else False
        # Through the manager's _hookexec, as pluggy's own callers: --trace-hooks sees the call.
        return self._pm._hookexec(self.name, self.get_hookimpls(), kwargs, firstresult)
