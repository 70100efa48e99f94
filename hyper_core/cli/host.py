"""What a command's arguments name: the plugin host (``--plugin``, ``--strict-plugins``) and
the validated config of ``args.config`` with its ``args.overrides``."""

from __future__ import annotations

import argparse
import os
from typing import TYPE_CHECKING

from ..errors import PluginError

if TYPE_CHECKING:
    from ..config import Config
    from ..plugins.manager import PluginHost


def plugin_host(args: argparse.Namespace) -> PluginHost:
    """The plugin host for this invocation (``--plugin`` modules, ``--strict-plugins``)."""
    from ..plugins import get_plugin_host

    return get_plugin_host(tuple(args.plugin), strict=True if args.strict_plugins else None)


def check_required_plugins(host: PluginHost, required: list[str]) -> None:
    """``[run] plugins`` names installed plugins (entry point or distribution) the run needs.

    A config never names code to import: these must already be installed.
    """
    for name in required:
        record = host.records.get(name) or next(
            (r for r in host.records.values() if r.distribution == name), None
        )
        if record is None:
            raise PluginError(f"$.run.plugins: plugin {name!r} is not installed (pip install it)")
        if record.status == "disabled":
            raise PluginError(
                f"$.run.plugins: plugin {name!r} is installed but disabled by "
                f"HYPER_TRAIN_PLUGINS={os.environ.get('HYPER_TRAIN_PLUGINS', '')!r}"
            )
        if record.status == "failed":
            raise PluginError(f"$.run.plugins: plugin {name!r} failed to load: {record.error}")


def load_run_config(args: argparse.Namespace) -> tuple[Config, PluginHost]:
    """Read and validate ``args.config`` (with ``args.overrides``) with the installed plugins,
    for the world size of ``--nproc-per-node``/``--nnodes`` when given; returns
    ``(config, host)``."""
    from ..config import load_config
    from ..config.adapter_options import check_adapter_options
    from ..config.world import check_world
    from ..resolve import strategy_class

    host = plugin_host(args)
    config = load_config(args.config, args.overrides, host.registries.config_sections)
    check_required_plugins(host, config.run.plugins)
    check_adapter_options(config, host.registries, source=str(args.config))
    nproc, nnodes = getattr(args, "nproc_per_node", None), getattr(args, "nnodes", None)
    strategy = strategy_class(config, host.registries)
    check_world(config, nproc, nnodes, source=str(args.config), strategy=strategy)
    return config, host


def load_checked_config(args: argparse.Namespace) -> tuple[Config, PluginHost]:
    """:func:`load_run_config`, then the checks against this machine that a run needs (its
    data files exist, its loggers are installed); an estimate needs neither."""
    from ..config.preflight import check_environment

    config, host = load_run_config(args)
    check_environment(config, source=str(args.config))
    return config, host
