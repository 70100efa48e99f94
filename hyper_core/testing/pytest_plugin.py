"""pytest plugin of hyper-train (entry point ``pytest11``): fixtures for plugin authors.

* ``hyper_host(*plugins)`` — an isolated plugin host with the core and only those plugins.
* ``hook_recorder`` — a :class:`~hyper_core.testing.HookRecorder` to pass as a plugin.
* ``tiny_run(config=None, plugins=(), steps=None, **sections)`` — train in-process; the config
  defaults to :func:`~hyper_core.testing.tiny_text_config` in a temporary directory.

It also registers the ``slow`` marker that :class:`~hyper_core.testing.AdapterConformance` puts
on its multi-process checks, so a plugin's test suite runs under ``--strict-markers``.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

SLOW_MARKER = "slow: multi-process or long tests (hyper-train's conformance checks mark them)"


def pytest_configure(config: pytest.Config) -> None:
    """Register the markers the kit's test classes use."""
    config.addinivalue_line("markers", SLOW_MARKER)


@pytest.fixture
def hyper_host() -> Callable[..., Any]:
    """Factory: ``hyper_host("my_pkg.plugin", MyPlugin())``."""
    from . import isolated_host

    return lambda *plugins: isolated_host(plugins)


@pytest.fixture
def hook_recorder() -> Any:
    """A plugin that records every stage and event call."""
    from . import HookRecorder

    return HookRecorder()


@pytest.fixture
def tiny_run(tmp_path: Path) -> Callable[..., Any]:
    """Factory running a tiny training in ``tmp_path``; returns a ``TinyRun``."""
    from . import run_tiny_training, tiny_text_config

    def run(
        config: Any = None, *, plugins: Any = (), steps: int | None = None, **sections: Any
    ) -> Any:
        cfg = config if config is not None else tiny_text_config(tmp_path / "run", **sections)
        return run_tiny_training(cfg, plugins=plugins, steps=steps)

    return run
