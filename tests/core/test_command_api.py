"""The command API: the core's commands are registered like a plugin's, and a plugin's command
gets what the core's use (global flags on nested actions, config overrides, descriptions)."""

from __future__ import annotations

import argparse
import json
from typing import Any

import pytest

from hyper_core import hookimpl
from hyper_core.cli import main
from hyper_core.cli.main import build_parser
from hyper_core.cli.parser import CommandParser
from hyper_core.errors import PluginError
from hyper_core.plugins.manager import BUILTIN_PLUGINS, PluginHost

CORE_COMMANDS = [
    "run",
    "plugins",
    "config",
    "data",
    "export",
    "chat",
    "predict",
    "plot",
    "new-plugin",
]


class Nested:
    """A plugin command with actions, one of which takes config overrides."""

    @hookimpl
    def register_commands(self, register: Any) -> None:
        def add_arguments(parser: CommandParser) -> None:
            sub = parser.add_subparsers(dest="action", required=True)
            show = sub.add_parser("show")
            show.accept_overrides()
            show.add_argument("config")
            old = sub.add_parser("old")
            # Written before commands had the global flags: declaring one again still works.
            old.add_argument("--debug", action="store_true", default=argparse.SUPPRESS)

        register("nested", add_arguments, lambda args: 0, description="nested actions")


def parser_with(*plugins: Any) -> argparse.ArgumentParser:
    host = PluginHost(entry_points=False)
    for i, plugin in enumerate(plugins):
        host.add_object(plugin, f"p{i}")
    return build_parser(host.registries.commands)


def test_the_core_commands_come_from_their_builtin_plugin() -> None:
    host = PluginHost(entry_points=False)
    commands = host.registries.commands
    assert list(commands)[: len(CORE_COMMANDS)] == CORE_COMMANDS
    assert {commands[name].plugin for name in CORE_COMMANDS} == {"hyper_core.cli.plugin"}
    assert host.records["hyper_core.cli.plugin"].registers["command"][0] == "run"


def test_global_flags_reach_nested_actions_and_survive_them() -> None:
    parser = parser_with(Nested())
    args = parser.parse_args(["nested", "show", "c.toml", "--debug", "--plugin", "m"])
    assert args.debug and args.plugin == ["m"] and args.accepts_overrides
    args = parser.parse_args(["--debug", "--strict-plugins", "nested", "show", "c.toml"])
    assert args.debug and args.strict_plugins and args.plugin == []
    args = parser.parse_args(["nested", "old", "--debug"])
    assert args.debug and not getattr(args, "accepts_overrides", False)
    assert parser.parse_args(["run", "x.toml", "--debug"]).debug
    assert not parser.parse_args(["run", "x.toml"]).debug


def test_overrides_only_where_a_parser_accepts_them(capsys: pytest.CaptureFixture[str]) -> None:
    parser = parser_with(Nested())
    _, extra = parser.parse_known_args(["nested", "old", "--x.y=1"])
    assert extra == ["--x.y=1"]
    with pytest.raises(SystemExit) as exc:
        main(["plot", "somewhere", "--training.steps=3"])
    assert exc.value.code == 2
    assert "unrecognized arguments: --training.steps=3" in capsys.readouterr().err


def test_a_description_is_shown_by_help() -> None:
    parser = parser_with(Nested())
    nested = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    assert nested.choices["nested"].description == "nested actions"
    assert "Train from a TOML config" in nested.choices["run"].format_help()


def test_a_plugin_cannot_take_a_core_command_name() -> None:
    class Clash:
        @hookimpl
        def register_commands(self, register: Any) -> None:
            register("run", lambda parser: None, lambda args: 0)

    with pytest.raises(PluginError, match=r"'run' is registered twice.*hyper_core\.cli\.plugin"):
        parser_with(Clash())


def test_plugins_lists_each_builtin_capability(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plugins", "--json"]) == 0
    records = {r["name"]: r for r in json.loads(capsys.readouterr().out)}
    for module in BUILTIN_PLUGINS:
        assert records[module]["status"] == "builtin", module
        assert records[module]["hooks"], f"{module} implements no hook"
    assert records["hyper_core.cli.plugin"]["registers"]["command"][:2] == ["run", "plugins"]
    assert records["hyper_core.builtin.formats"]["registers"]["dataset format"] == [
        "jsonl",
        "parquet",
        "hf",
    ]
