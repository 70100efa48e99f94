"""Checks of a valid config against this machine, before anything is built: the data files and
image directories it names exist (with a did-you-mean on a near miss) and the loggers it turns
on are installed. ``config validate``, ``run`` (``--dry-run`` too) and ``data`` run them."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from ..errors import ConfigError
from .converter import did_you_mean
from .schema import Config, source_list

#: Formats whose ``path`` is a file or directory that must exist (plugins' formats may take
#: paths they create, e.g. a cache).
FILE_FORMATS = ("jsonl", "parquet", "hf")
_GLOB_CHARS = "*?["

#: ``[logging]`` switch -> (module it needs, the extra that installs it).
LOGGERS = {"tensorboard": ("tensorboard", "hyper-train[tensorboard]")}


def config_dir(config: Config) -> Path:
    """The directory relative paths of ``config`` resolve against: its file's, else the cwd."""
    return Path(config.source_path).parent if config.source_path else Path.cwd()


def missing_path_message(path: Path, what: str) -> str:
    """``WHAT not found: PATH``, with the closest name in its directory when one is close, or
    the first missing directory."""
    parent = path.parent
    while not parent.is_dir() and parent != parent.parent:
        path, parent = parent, parent.parent
        what = "directory"
    names = [p.name for p in parent.iterdir()] if parent.is_dir() else []
    return f"{what} not found: {path}{did_you_mean(path.name, names)}"


def _resolve(value: str, base: Path) -> Path:
    path = Path(value).expanduser()
    return path if path.is_absolute() else base / path


def data_path_problems(config: Config) -> list[tuple[str, str]]:
    """``($.data.train..., message)`` for each data file or image directory that is missing."""
    base = config_dir(config)
    data = config.data
    problems: list[tuple[str, str]] = []
    if data.image_root is not None:
        root = _resolve(data.image_root, base)
        if not root.is_dir():
            problems.append(("$.data.image_root", missing_path_message(root, "image directory")))
    for key in ("train", "eval"):
        sources = getattr(data, key)
        if sources is None:
            continue
        for where, source in source_list(sources, f"$.data.{key}"):
            if source.image_dir is not None:
                image_dir = _resolve(source.image_dir, base)
                if not image_dir.is_dir():
                    message = missing_path_message(image_dir, "image directory")
                    problems.append((f"{where}.image_dir", message))
            if source.format not in FILE_FORMATS or source.path is None:
                continue
            if any(c in source.path for c in _GLOB_CHARS):
                continue  # a glob that matches nothing is reported where it is expanded
            path = _resolve(source.path, base)
            if not path.exists():
                what = "data directory" if source.format == "hf" else "data file"
                at = where if source.is_plain_path else f"{where}.path"
                problems.append((at, missing_path_message(path, what)))
    return problems


def logger_problems(config: Config) -> list[tuple[str, str]]:
    """``($.logging.X, message)`` for each logger turned on whose package is not installed."""
    problems = []
    for switch, (module, extra) in LOGGERS.items():
        if getattr(config.logging, switch) and importlib.util.find_spec(module) is None:
            problems.append(
                (f"$.logging.{switch}", f"{module} is not installed; pip install '{extra}'")
            )
    return problems


def check_environment(config: Config, source: str | None = None) -> None:
    """Raise one :class:`ConfigError` with every missing data path and logger."""
    problems = data_path_problems(config) + logger_problems(config)
    if problems:
        raise ConfigError(problems, source=source)
