"""Reading JSON-lines data sets with provenance (no torch here).

Every raw sample is a dict carrying ``"_source": {"file": str, "line": int}``. A line that is
not valid JSON (or not an object) becomes a *deferred error*, ``{"_source": ..., "_error":
(reason, message)}``, so that skipping or raising happens in one place, the dataset.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..errors import ConfigError, DataError

RawSample = dict[str, Any]

SOURCE_KEY = "_source"
ERROR_KEY = "_error"


def read_jsonl(path: str | Path) -> list[RawSample]:
    """All samples of a ``.jsonl`` file, blank lines ignored, each with its ``_source``."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise DataError(f"data file not found: {path}") from None
    except IsADirectoryError:
        raise DataError(f"data path is a directory, expected a .jsonl file: {path}") from None
    except UnicodeDecodeError as exc:
        raise DataError(f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    file = str(path.resolve())
    samples: list[RawSample] = []
    for lineno, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        source = {"file": file, "line": lineno}
        try:
            value = json.loads(line)
        except json.JSONDecodeError as exc:
            samples.append({SOURCE_KEY: source, ERROR_KEY: ("invalid_json", exc.msg)})
            continue
        if not isinstance(value, dict):
            message = f"expected a JSON object, got {type(value).__name__}"
            samples.append({SOURCE_KEY: source, ERROR_KEY: ("bad_format", message)})
            continue
        value[SOURCE_KEY] = source
        samples.append(value)
    return samples


def format_source(sample: Mapping[str, Any] | None, index: int | None = None) -> str:
    """``file:line`` of a raw sample, else ``sample #index``."""
    source = sample.get(SOURCE_KEY) if isinstance(sample, Mapping) else None
    if isinstance(source, Mapping) and "file" in source:
        return f"{source['file']}:{source.get('line', '?')}"
    return f"sample #{index}" if index is not None else "sample"


_JSONL_OPTIONS = ("max_samples",)


def load_jsonl_format(
    path: str | None,
    options: Mapping[str, Any] | None = None,
    base_dir: str | Path | None = None,
    *,
    where: str = "$.data.train",
) -> list[RawSample]:
    """The ``jsonl`` dataset format: ``path`` (relative to ``base_dir``) read with provenance.

    ``options`` may hold ``max_samples`` (keep the first N lines). ``where`` is the config path
    used in error messages.
    """
    options = dict(options or {})
    problems = [
        (f"{where}.{key}", f"unknown option {key!r} of format 'jsonl' (known: max_samples)")
        for key in options
        if key not in _JSONL_OPTIONS
    ]
    limit = options.get("max_samples")
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
        problems.append((f"{where}.max_samples", f"expected a positive int, got {limit!r}"))
    if not path:
        problems.append((f"{where}.path", "format 'jsonl' needs a path"))
    if problems:
        raise ConfigError(problems)
    resolved = Path(path)  # type: ignore[arg-type]
    if not resolved.is_absolute() and base_dir is not None:
        resolved = Path(base_dir) / resolved
    samples = read_jsonl(resolved)
    return samples[:limit] if limit is not None else samples
