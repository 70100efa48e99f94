"""Reading JSON-lines and JSON-array data sets with provenance (no torch here).

Every raw sample is a dict carrying ``"_source"``: ``{"file": str, "line": int}`` for JSON lines
(1-based), ``{"file": str, "index": int}`` for an element of a JSON array (0-based). A line or
element that cannot be a sample becomes a *deferred error*, ``{"_source": ..., "_error":
(reason, message)}``, so that skipping or raising happens in one place, the dataset.

Reading never loses a valid sample to its neighbours: a file is read as bytes, a UTF-8 BOM is
dropped, lines are split on ``\\n`` only (never inside a JSON string at U+2028 or U+0085), and
each line is decoded and parsed on its own by :func:`parse_line`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, overload

import attrs

from ..config.fields import at_least, meta
from ..errors import ConfigError, DataError

RawSample = dict[str, Any]

SOURCE_KEY = "_source"
ERROR_KEY = "_error"
#: Where relative image paths of the sample resolve (set from ``[data] image_root`` or a
#: source's ``image_dir``); absent: the directory of ``_source.file``.
IMAGE_DIR_KEY = "_image_dir"

#: Default of the ``max_line_bytes`` option. A line is parsed in full before anything else is
#: checked, and Python's JSON objects take ~10x the text's size in memory: 64 MiB bounds one
#: line's parse to about a second and under 1 GiB, far above any conversation that fits a
#: context window (text over ``max_seq_len`` is rejected before tokenising, see chat.py).
DEFAULT_MAX_LINE_BYTES = 64 * 1024 * 1024

_BOM = b"\xef\xbb\xbf"


def _deferred(source: dict[str, Any], reason: str, message: str) -> RawSample:
    return {SOURCE_KEY: source, ERROR_KEY: (reason, message)}


def _as_sample(value: Any, source: dict[str, Any]) -> RawSample:
    if not isinstance(value, dict):
        message = f"expected a JSON object, got {type(value).__name__}"
        return _deferred(source, "bad_format", message)
    value[SOURCE_KEY] = source
    return value


def too_long(length: int, source: dict[str, Any], max_line_bytes: int) -> RawSample:
    """The deferred ``too_long`` error of a line of ``length`` bytes (the line is not read)."""
    message = f"line of {length} bytes > max_line_bytes {max_line_bytes} (not parsed)"
    return _deferred(source, "too_long", message)


def parse_line(
    raw: bytes, source: dict[str, Any], *, max_line_bytes: int = DEFAULT_MAX_LINE_BYTES
) -> RawSample:
    """One JSON line (without its ``\\n``) as a raw sample, or a deferred error.

    Reasons: ``too_long`` (over ``max_line_bytes``, not parsed), ``invalid_utf8``,
    ``invalid_json`` (including nesting too deep to parse), ``bad_format`` (not an object).
    """
    if len(raw) > max_line_bytes:
        return too_long(len(raw), source, max_line_bytes)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        message = f"not UTF-8 ({exc.reason} at byte {exc.start} of the line)"
        return _deferred(source, "invalid_utf8", message)
    try:
        value = json.loads(text)
    except RecursionError:
        return _deferred(source, "invalid_json", "nested too deeply")
    except ValueError as exc:  # JSONDecodeError, or an integer too long to convert
        message = exc.msg if isinstance(exc, json.JSONDecodeError) else str(exc)
        return _deferred(source, "invalid_json", message)
    return _as_sample(value, source)


def _read_bytes(path: Path) -> bytes:
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise DataError(f"data file not found: {path}") from None
    except IsADirectoryError:
        raise DataError(f"data path is a directory, expected a .jsonl file: {path}") from None
    return data[len(_BOM) :] if data.startswith(_BOM) else data


def read_jsonl(
    path: str | Path, *, max_line_bytes: int = DEFAULT_MAX_LINE_BYTES
) -> list[RawSample]:
    """All samples of a data file, each with its ``_source``.

    JSON lines (blank lines ignored); a ``.json`` file whose first non-blank character is ``[``
    is read as a JSON array of samples instead (LLaVA's format), parsed at once (memory: the
    file's objects). A file that is not one valid array is a :class:`DataError` naming the file
    and the position; an element that is not an object is a deferred ``bad_format`` error.
    """
    path = Path(path)
    data = _read_bytes(path)
    file = str(path.resolve())
    if path.suffix.lower() == ".json" and data.lstrip()[:1] == b"[":
        return _json_array(data, path, file)
    samples: list[RawSample] = []
    for lineno, raw in enumerate(data.split(b"\n"), start=1):
        if raw.endswith(b"\r"):
            raw = raw[:-1]
        if not raw.strip():
            continue
        source = {"file": file, "line": lineno}
        samples.append(parse_line(raw, source, max_line_bytes=max_line_bytes))
    if path.suffix.lower() == ".json" and samples:
        if samples[0].get(ERROR_KEY, ("",))[0] == "invalid_json":
            _reject_top_level_object(data, path)
    return samples


def _json_array(data: bytes, path: Path, file: str) -> list[RawSample]:
    try:
        value = json.loads(data.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise DataError(f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    except RecursionError:
        raise DataError(f"{path}: not a valid JSON array (nested too deeply)") from None
    except json.JSONDecodeError as exc:
        raise DataError(
            f"{path}: not a valid JSON array ({exc.msg} at line {exc.lineno} column {exc.colno})"
        ) from None
    except ValueError as exc:
        raise DataError(f"{path}: not a valid JSON array ({exc})") from None
    if not isinstance(value, list):
        raise DataError(f"{path}: expected a JSON array of samples, got {type(value).__name__}")
    return [_as_sample(item, {"file": file, "index": i}) for i, item in enumerate(value)]


def _reject_top_level_object(data: bytes, path: Path) -> None:
    """A ``.json`` file whose first line is not a sample: one object over several lines?"""
    try:
        value = json.loads(data.decode("utf-8"))
    except (ValueError, RecursionError):  # not one JSON value: JSON lines with a bad line
        return
    if isinstance(value, dict):
        keys = ", ".join(sorted(value)[:5]) or "none"
        raise DataError(
            f"{path}: one JSON object at the top level (keys: {keys}); expected one sample "
            "object per line or a JSON array of samples"
        )


def format_source(sample: Mapping[str, Any] | None, index: int | None = None) -> str:
    """``file:line`` (JSON lines) or ``file[index]`` (JSON array) of a raw sample, else
    ``sample #index``."""
    source = sample.get(SOURCE_KEY) if isinstance(sample, Mapping) else None
    if isinstance(source, Mapping) and "file" in source:
        if "index" in source:
            return f"{source['file']}[{source['index']}]"
        return f"{source['file']}:{source.get('line', '?')}"
    return f"sample #{index}" if index is not None else "sample"


@attrs.frozen(kw_only=True)
class JsonlOptions:
    """Options of the ``jsonl`` format (``[data] train = { format = "jsonl", path = ..., ... }``;
    ``image_dir`` is a key of every source, not an option)."""

    max_samples: int | None = attrs.field(
        default=None, validator=at_least(1), metadata=meta("Keep the first N samples.")
    )
    max_line_bytes: int = attrs.field(
        default=DEFAULT_MAX_LINE_BYTES,
        validator=at_least(1),
        metadata=meta("Longer lines are `too_long` samples, not parsed (default 64 MiB)."),
    )


def load_jsonl_format(
    path: str | None,
    options: JsonlOptions | None = None,
    base_dir: str | Path | None = None,
    *,
    where: str = "$.data.train",
) -> Sequence[RawSample]:
    """The ``jsonl`` dataset format: ``path`` (relative to ``base_dir``) read with provenance.

    JSON lines are read lazily (:class:`~hyper_core.data.jsonl_index.JsonlFile`, indexed once);
    a ``.json`` file is read whole, as JSON lines or a JSON array. ``options`` are
    :class:`JsonlOptions` (None: the defaults). ``where`` is the config path used in error
    messages.
    """
    options = options or JsonlOptions()
    if not path:
        raise ConfigError([(f"{where}.path", "format 'jsonl' needs a path")])
    resolved = Path(path)
    if not resolved.is_absolute() and base_dir is not None:
        resolved = Path(base_dir) / resolved
    samples: Sequence[RawSample]
    if resolved.suffix.lower() == ".json":  # may be a JSON array: parsed whole
        samples = read_jsonl(resolved, max_line_bytes=options.max_line_bytes)
    else:
        from .jsonl_index import JsonlFile

        samples = JsonlFile(resolved, max_line_bytes=options.max_line_bytes)
    limit = options.max_samples
    return samples[:limit] if limit is not None else samples


class WithImageDir(Sequence[RawSample]):
    """``samples`` with ``_image_dir`` set on each sample as it is read (lazy samples stay
    lazy); slicing keeps the directory."""

    def __init__(self, samples: Sequence[RawSample], image_dir: str) -> None:
        self.samples = samples
        self.image_dir = image_dir

    def __len__(self) -> int:
        return len(self.samples)

    @overload
    def __getitem__(self, index: int) -> RawSample: ...

    @overload
    def __getitem__(self, index: slice) -> WithImageDir: ...

    def __getitem__(self, index: int | slice) -> RawSample | WithImageDir:
        if isinstance(index, slice):
            return WithImageDir(self.samples[index], self.image_dir)
        return {**self.samples[index], IMAGE_DIR_KEY: self.image_dir}
