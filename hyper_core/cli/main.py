"""Argument parsing over the registered commands, and turning errors into exit codes.

User errors (:class:`~hyper_core.errors.UserError`) print one line and exit 2; ``--debug``
shows the traceback. Any other exception is a failed run: exit 1, with a
traceback unless it is a :class:`~hyper_core.errors.RunFailed` (one line, e.g. a diverged run).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import traceback
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, NoReturn

from ..errors import RunFailed, UserError
from .parser import CommandParser, add_global_options

if TYPE_CHECKING:
    from ..registry import CommandSpec

EXIT_USER_ERROR = 2
EXIT_FAILED = 1


def build_parser(commands: Mapping[str, CommandSpec]) -> argparse.ArgumentParser:
    """The parser of ``hyper-train`` with the registered ``commands`` (the core's among them,
    :mod:`hyper_core.cli.plugin`), in registration order; each command's parser is a
    :class:`~hyper_core.cli.parser.CommandParser`."""
    parser = argparse.ArgumentParser(
        prog="hyper-train",
        description="Train vision-language models with plugins.",
    )
    parser.add_argument("--version", action="store_true", help="print the version and exit")
    add_global_options(parser)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=CommandParser)
    for spec in commands.values():
        p = sub.add_parser(
            spec.name,
            help=spec.help or f"(from plugin {spec.plugin})",
            description=spec.description,
        )
        spec.add_arguments(p)
        p.set_defaults(handler=spec.run)
    return parser


def _setup_logging(debug: bool) -> None:
    rank = int(os.environ.get("RANK", "0"))
    level = logging.DEBUG if debug else (logging.INFO if rank == 0 else logging.ERROR)
    logging.basicConfig(level=level, format="hyper-train: %(message)s", stream=sys.stderr)
    for noisy in ("httpx", "urllib3", "filelock"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    # torchao (hyper-train-peft[qlora]; transformers and peft import it when installed) warns
    # on import of the CUDA kernels a CPU build cannot load, and registers its enums with
    # torch's pytree, which warns too: neither concerns a run
    for noisy in ("torchao", "torch.utils._pytree"):
        logging.getLogger(noisy).setLevel(logging.ERROR)


def _quiet_library_bars() -> None:
    """No Hugging Face progress bars (loading, writing weights) in piped logs: they are
    carriage-return animations. Read by huggingface_hub when transformers is first imported,
    which the CLI does lazily, after this; a run's own bar mode is handled by the trainer."""
    if not sys.stderr.isatty():
        os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")


def _commands(argv: Sequence[str]) -> dict[str, CommandSpec]:
    """Every registered command (plugins import no torch)."""
    from ..plugins import get_plugin_host

    strict = "--strict-plugins" in argv or None
    return get_plugin_host(strict=strict).registries.commands


def console_main() -> NoReturn:
    """The ``hyper-train`` script and ``python -m hyper_core``: :func:`main`, then exit with its
    code; a torchrun rank exits without interpreter finalisation
    (:func:`~hyper_core.parallel.exit.exit_rank`)."""
    from ..parallel.exit import exit_rank, is_torchrun_rank

    code = main()
    if is_torchrun_rank():
        exit_rank(code)
    sys.exit(code)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``hyper-train``; returns the exit code."""
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in argv
    try:
        parser = build_parser(_commands(argv))
        args, extra = parser.parse_known_args(argv)
        if args.version:
            from .. import __version__

            print(f"hyper-train {__version__}")
            return 0
        if args.command is None:
            parser.print_help()
            return 0
        if extra and not getattr(args, "accepts_overrides", False):
            parser.error(f"unrecognized arguments: {' '.join(extra)}")
        args.overrides = extra
        _setup_logging(args.debug)
        _quiet_library_bars()
        code = args.handler(args)
        return int(code or 0)
    except UserError as exc:
        if debug:
            traceback.print_exc()
        print(f"hyper-train: error: {exc}", file=sys.stderr)
        return EXIT_USER_ERROR
    except KeyboardInterrupt:
        print("hyper-train: interrupted", file=sys.stderr)
        return 130
    except SystemExit:
        raise
    except RunFailed as exc:
        if debug:
            traceback.print_exc()
        print(f"hyper-train: error: {exc}", file=sys.stderr)
        return EXIT_FAILED
    except Exception:
        traceback.print_exc()
        print("hyper-train: the run failed (see the traceback above)", file=sys.stderr)
        return EXIT_FAILED
