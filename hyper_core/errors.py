"""Exceptions that the CLI turns into exit codes.

A :class:`UserError` is something the user can fix (bad config, bad data, a missing plugin): the
CLI prints its message on one line and exits 2, without a traceback unless ``--debug``.
A :class:`RunFailed` is a failed run whose cause one line states (exit 1, no traceback unless
``--debug``). Anything else is a failed run with a traceback (exit 1).
"""

from __future__ import annotations


class UserError(Exception):
    """A problem with the user's input; printed as one line, exit code 2."""

    exit_code = 2


class ConfigError(UserError):
    """One or more problems in a config, each with its ``$.path``."""

    def __init__(self, problems: list[tuple[str, str]] | str, source: str | None = None) -> None:
        if isinstance(problems, str):
            problems = [("$", problems)]
        self.problems = list(problems)
        self.source = source
        super().__init__(self._format())

    def _format(self) -> str:
        where = f"{self.source}: " if self.source else ""
        lines = [f"{path}: {msg}" for path, msg in self.problems]
        if len(lines) == 1:
            return f"{where}{lines[0]}"
        return f"{where}{len(lines)} problems\n" + "\n".join(f"  {line}" for line in lines)


class PluginError(UserError):
    """A plugin could not be found, loaded, or conflicts with another."""


class DataError(UserError):
    """Bad training data (raised when ``[data] on_error = "raise"``, or when nothing is usable)."""


class RunFailed(Exception):
    """A failed run whose cause its message states in one line (e.g. a full disk): exit code 1,
    printed without a traceback."""

    exit_code = 1
