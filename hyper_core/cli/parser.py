"""The parsers of ``hyper-train`` commands, the core's and plugins' alike.

Every command's parser is a :class:`CommandParser`: it accepts the global flags after the
command name, and so does every parser nested in it (``hyper-train memory estimate --debug``),
without resetting a flag given before the command.
"""

from __future__ import annotations

import argparse
from typing import Any

#: The flags every command accepts.
GLOBAL_FLAGS = frozenset({"--debug", "--strict-plugins", "--plugin"})


def add_global_options(parser: argparse.ArgumentParser, *, defaults: bool = True) -> None:
    """``--debug``, ``--strict-plugins``, ``--plugin MODULE``; ``defaults=False`` (a command's
    parser) leaves a flag absent from the namespace unless given there."""

    def default(value: Any) -> Any:
        return value if defaults else argparse.SUPPRESS

    parser.add_argument(
        "--debug",
        action="store_true",
        default=default(False),
        help="show tracebacks of user errors",
    )
    parser.add_argument(
        "--strict-plugins",
        action="store_true",
        default=default(False),
        help="a plugin that fails to load is fatal (also HYPER_TRAIN_STRICT_PLUGINS=1)",
    )
    parser.add_argument(
        "--plugin",
        action="append",
        default=default([]),
        metavar="MODULE",
        help="also load this importable module as a plugin (repeatable)",
    )


class CommandParser(argparse.ArgumentParser):
    """The parser a command's ``add_arguments`` fills (and, through ``add_subparsers``, the
    parsers of its actions): with the global flags."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        add_global_options(self, defaults=False)

    def add_argument(self, *args: Any, **kwargs: Any) -> argparse.Action:
        """As argparse's; a global flag declared again (by a plugin written before commands
        had them) is the one already there."""
        if args and args[0] in GLOBAL_FLAGS and args[0] in self._option_string_actions:
            return self._option_string_actions[args[0]]
        return super().add_argument(*args, **kwargs)

    def accept_overrides(self) -> None:
        """Extra ``--section.key=value`` arguments reach the command as ``args.overrides``
        (config overrides); without this they are an error."""
        self.set_defaults(accepts_overrides=True)


def add_world_options(parser: argparse.ArgumentParser) -> None:
    """``--nproc-per-node``/``--nnodes``: the world size the config is checked against
    (:func:`~hyper_core.cli.host.load_run_config`)."""
    parser.add_argument("--nproc-per-node", type=int, default=None, help="processes per node")
    parser.add_argument(
        "--nnodes",
        default=None,
        help="nodes, N or MIN:MAX (the config is checked for every world size in between)",
    )
