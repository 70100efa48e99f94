"""The strict cattrs converter behind configs: no coercion, exact ``$.a.b[i]`` error paths.

Structuring never stops at the first problem. Every problem in the whole input is collected as
``(path, message)`` and raised together in one :class:`~hyper_core.errors.ConfigError`.

Plugins structure their own sections with the same :data:`converter`::

    section = converter.structure_at(raw, MySection, path="$.my_plugin")
"""

from __future__ import annotations

import contextlib
import contextvars
import copy
import datetime
import difflib
import functools
import json
import re
import types
import typing
from collections.abc import Callable, Iterable, Iterator
from typing import Any, Literal, TypeVar

import attrs
import cattrs

from hyper_core.errors import ConfigError

T = TypeVar("T")

_BARE_KEY = re.compile(r"[A-Za-z0-9_-]+")


class Invalid(Exception):
    """Raised by a structure hook: the value at the current path is wrong (``msg`` says how)."""

    def __init__(self, msg: str) -> None:
        super().__init__(msg)
        self.msg = msg


class _Reported(Exception):
    """Problems below the current path have already been recorded."""


class _Failed:
    def __repr__(self) -> str:
        return "FAILED"


FAILED: Any = _Failed()
"""Returned by :meth:`Problems.structure` when the value had problems."""


def join_key(path: str, key: str) -> str:
    """``$.a`` + ``b`` → ``$.a.b``; keys that are not bare TOML keys are quoted: ``$.a["x y"]``."""
    if _BARE_KEY.fullmatch(key):
        return f"{path}.{key}"
    return f"{path}[{json.dumps(key)}]"


def show(value: Any) -> str:
    """A short TOML-flavoured rendering of a value for messages."""
    if isinstance(value, bool):
        return "true" if value else "false"
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def describe(value: Any) -> str:
    """Type and value, e.g. ``str ('0.001')``; tables are described without their content."""
    if value is None:
        return "None"
    if isinstance(value, dict):
        return "table"
    if isinstance(value, bool):
        kind = "bool"
    elif isinstance(value, (list, tuple)):
        kind = "array"
    elif isinstance(value, datetime.datetime):
        kind = "datetime"
    elif isinstance(value, datetime.date):
        kind = "date"
    elif isinstance(value, datetime.time):
        kind = "time"
    else:
        kind = type(value).__name__
    return f"{kind} ({show(value)})"


def did_you_mean(word: str, candidates: Iterable[str]) -> str:
    """``"; did you mean 'lr'?"`` when a candidate is close to ``word``, else ``""``."""
    match = difflib.get_close_matches(word, list(candidates), n=1, cutoff=0.6)
    return f"; did you mean {match[0]!r}?" if match else ""


def unknown_key_message(key: str, candidates: Iterable[str]) -> str:
    """The message for a key that is not allowed, with a did-you-mean or the allowed keys."""
    candidates = list(candidates)
    hint = did_you_mean(key, candidates)
    if hint:
        return f"unknown key{hint}"
    if candidates:
        return f"unknown key; valid keys: {', '.join(candidates)}"
    return "unknown key; this table takes no keys"


def type_name(cl: Any) -> str:
    """How a type is named in messages."""
    origin = typing.get_origin(cl)
    if origin is Literal:
        return "one of " + ", ".join(show(a) for a in typing.get_args(cl))
    if cl is list or origin is list:
        return "an array"
    if cl is dict or origin is dict or (isinstance(cl, type) and attrs.has(cl)):
        return "a table"
    if isinstance(cl, type):
        return cl.__name__
    return str(cl)


def field_key(field: attrs.Attribute) -> str:
    """The TOML key of an attrs field (``metadata={"key": ...}``, else the field name)."""
    return field.metadata.get("key", field.name)


def toml_fields(cls: type) -> dict[str, attrs.Attribute]:
    """The fields of an attrs class that appear in TOML, by TOML key."""
    return _toml_fields(cls)


@functools.cache
def _toml_fields(cls: type) -> dict[str, attrs.Attribute]:
    attrs.resolve_types(cls)
    return {field_key(f): f for f in attrs.fields(cls) if f.init and f.metadata.get("toml", True)}


class Problems:
    """Collects ``(path, message)`` problems while structuring, tracking the current path."""

    def __init__(self, root: str = "$") -> None:
        self.path = root
        self.problems: list[tuple[str, str]] = []

    def add(self, msg: str, path: str | None = None) -> None:
        """Record a problem at ``path`` (default: the current path)."""
        self.problems.append((self.path if path is None else path, msg))

    def add_key(self, key: str, msg: str) -> None:
        """Record a problem at the child ``key`` of the current path."""
        self.add(msg, join_key(self.path, key))

    @contextlib.contextmanager
    def at(self, path: str) -> Iterator[None]:
        """Temporarily move the current path to ``path``."""
        saved, self.path = self.path, path
        try:
            yield
        finally:
            self.path = saved

    def at_key(self, key: str) -> contextlib.AbstractContextManager[None]:
        return self.at(join_key(self.path, key))

    def at_index(self, index: int) -> contextlib.AbstractContextManager[None]:
        return self.at(f"{self.path}[{index}]")

    @contextlib.contextmanager
    def active(self) -> Iterator[Problems]:
        """Make this the collector that the converter's hooks record into."""
        token = _current.set(self)
        try:
            yield self
        finally:
            _current.reset(token)

    def structure(self, conv: cattrs.Converter, value: Any, cl: Any) -> Any:
        """Structure ``value`` at the current path; :data:`FAILED` (problems recorded) if bad."""
        return self.structure_with(lambda: conv.structure(value, cl), value)

    def structure_with(self, func: Callable[[], Any], value: Any = None) -> Any:
        """Run ``func`` (which structures ``value``), recording its problems at the current path."""
        try:
            return func()
        except Invalid as exc:
            self.add(exc.msg)
        except _Reported:
            pass
        except ConfigError as exc:
            self.extend_rooted(exc.problems)
        except (cattrs.BaseValidationError, TypeError, ValueError) as exc:
            self.add(f"invalid value {show(value)}: {exc}")
        return FAILED

    def extend_rooted(self, problems: Iterable[tuple[str, str]]) -> None:
        """Record problems whose paths start at ``$``, re-rooted at the current path."""
        for path, msg in problems:
            self.add(msg, self.path + path[1:] if path.startswith("$") else path)

    def raise_if_any(self, source: str | None = None) -> None:
        if self.problems:
            raise ConfigError(self.problems, source=source)


_current: contextvars.ContextVar[Problems | None] = contextvars.ContextVar(
    "hyper_core_config_problems", default=None
)


def _contextual(
    hook: Callable[[StrictConverter, Any, Any], Any],
) -> Callable[[StrictConverter, Any, Any], Any]:
    """Let a composite hook called directly (outside ``structure``) still collect problems."""

    @functools.wraps(hook)
    def wrapper(self: StrictConverter, value: Any, cl: Any) -> Any:
        if _current.get() is None:
            return self.structure(value, cl)
        return hook(self, value, cl)

    return wrapper


def _problems() -> Problems:
    problems = _current.get()
    assert problems is not None
    return problems


def _is_attrs_class(cl: Any) -> bool:
    return isinstance(cl, type) and attrs.has(cl)


def _is_union(cl: Any) -> bool:
    return typing.get_origin(cl) in (typing.Union, types.UnionType)


def _origin_is(*origins: Any) -> Callable[[Any], bool]:
    return lambda cl: cl in origins or typing.get_origin(cl) in origins


class StrictConverter(cattrs.Converter):
    """A cattrs converter that never coerces and reports every problem with its path.

    - ``int`` takes only int (not bool, not 3.0, not ``"3"``); ``float`` takes int or float;
      ``bool`` only bool; ``str`` only str.
    - ``Literal[...]`` checks membership; ``X | None`` takes None (TOML has no null, so None
      only comes from defaults or Python callers).
    - ``list[T]`` element-wise (``$.a[1]``); ``dict[str, T]`` key-wise; ``Any`` passes through.
    - attrs classes: unknown keys are errors with a did-you-mean, missing required keys are
      errors, field validators run, and a :class:`ConfigError` raised by the class itself (its
      cross-field rules) is re-rooted at the table's path. A field's TOML key can differ from its
      name (``metadata={"key": "async"}``); fields with ``metadata={"toml": False}`` are not read.
    """

    def __init__(self) -> None:
        super().__init__()
        for cl, hook in (
            (bool, self._strict_bool),
            (int, self._strict_int),
            (float, self._strict_float),
            (str, self._strict_str),
        ):
            self.register_structure_hook(cl, hook)
        self.register_structure_hook_func(
            lambda cl: cl is Any or cl is object, self._strict_passthrough
        )
        self.register_structure_hook_func(_origin_is(list), self._strict_list)
        self.register_structure_hook_func(_origin_is(dict), self._strict_dict)
        self.register_structure_hook_func(_is_union, self._strict_union)
        self.register_structure_hook_func(
            lambda cl: typing.get_origin(cl) is Literal, self._strict_literal
        )
        self.register_structure_hook_factory(_is_attrs_class, self._strict_attrs_factory)
        self.register_unstructure_hook_factory(_is_attrs_class, self._strict_unstructure_factory)

    def structure(self, obj: Any, cl: Any) -> Any:
        """Structure ``obj`` as ``cl``; at the top level, raise one ConfigError for all problems."""
        if _current.get() is not None:
            return super().structure(obj, cl)
        return self.structure_at(obj, cl)

    def structure_at(
        self, obj: Any, cl: type[T] | Any, path: str = "$", source: str | None = None
    ) -> T:
        """Structure ``obj`` whose location is ``path``; raise ConfigError with every problem."""
        problems = _current.get()
        if problems is not None:
            with problems.at(path):
                result = problems.structure(self, obj, cl)
            if result is FAILED:
                raise _Reported
            return result
        problems = Problems(path)
        with problems.active():
            result = problems.structure(self, obj, cl)
        problems.raise_if_any(source)
        return result

    @staticmethod
    def _strict_passthrough(value: Any, _: Any) -> Any:
        return copy.deepcopy(value)

    @staticmethod
    def _strict_bool(value: Any, _: Any) -> bool:
        if type(value) is bool:
            return value
        raise Invalid(f"expected bool, got {describe(value)}")

    @staticmethod
    def _strict_int(value: Any, _: Any) -> int:
        if type(value) is int:
            return value
        raise Invalid(f"expected int, got {describe(value)}")

    @staticmethod
    def _strict_float(value: Any, _: Any) -> float:
        if type(value) in (int, float):
            return float(value)
        raise Invalid(f"expected float, got {describe(value)}")

    @staticmethod
    def _strict_str(value: Any, _: Any) -> str:
        if type(value) is str:
            return value
        raise Invalid(f"expected str, got {describe(value)}")

    @staticmethod
    def _strict_literal(value: Any, cl: Any) -> Any:
        allowed = typing.get_args(cl)
        for option in allowed:
            if type(value) is type(option) and value == option:
                return option
        choices = ", ".join(show(a) for a in allowed)
        if isinstance(value, str) and any(isinstance(a, str) for a in allowed):
            hint = did_you_mean(value, [a for a in allowed if isinstance(a, str)])
            raise Invalid(f"invalid value {show(value)}; expected one of {choices}{hint}")
        raise Invalid(f"expected one of {choices}, got {describe(value)}")

    @_contextual
    def _strict_union(self, value: Any, cl: Any) -> Any:
        args = typing.get_args(cl)
        if value is None and type(None) in args:
            return None
        options = [a for a in args if a is not type(None)]
        if len(options) == 1:
            return self.structure(value, options[0])
        here = _problems().path
        for option in options:
            trial = Problems(here)
            with trial.active():
                result = trial.structure(self, value, option)
            if result is not FAILED:
                return result
        names = " or ".join(type_name(o) for o in options)
        raise Invalid(f"expected {names}, got {describe(value)}")

    @_contextual
    def _strict_list(self, value: Any, cl: Any) -> list[Any]:
        if not isinstance(value, (list, tuple)):
            raise Invalid(f"expected an array, got {describe(value)}")
        (item_type,) = typing.get_args(cl) or (Any,)
        problems = _problems()
        out: list[Any] = []
        failed = False
        for index, item in enumerate(value):
            with problems.at_index(index):
                result = problems.structure(self, item, item_type)
            failed |= result is FAILED
            out.append(result)
        if failed:
            raise _Reported
        return out

    @_contextual
    def _strict_dict(self, value: Any, cl: Any) -> dict[str, Any]:
        if not isinstance(value, dict):
            raise Invalid(f"expected a table, got {describe(value)}")
        _, value_type = typing.get_args(cl) or (str, Any)
        problems = _problems()
        out: dict[str, Any] = {}
        failed = False
        for key, item in value.items():
            if not isinstance(key, str):
                problems.add(f"keys must be strings, got {describe(key)}")
                failed = True
                continue
            with problems.at_key(key):
                result = problems.structure(self, item, value_type)
            failed |= result is FAILED
            out[key] = result
        if failed:
            raise _Reported
        return out

    def _strict_attrs_factory(self, cls: type) -> Callable[[Any, Any], Any]:
        def hook(value: Any, _: Any) -> Any:
            if _current.get() is None:
                return self.structure(value, cls)
            return self._strict_attrs(value, cls)

        hook.is_table_hook = True  # type: ignore[attr-defined]
        return hook

    def _is_table(self, cl: Any) -> bool:
        """True when ``cl`` is structured from a table by the attrs hook (a missing one is {})."""
        return _is_attrs_class(cl) and getattr(self.get_structure_hook(cl), "is_table_hook", False)

    def structure_table(self, value: Any, cls: type[T]) -> T:
        """Structure a table into the attrs class ``cls`` with the strict field rules.

        For custom hooks that preprocess a table: registering a hook for ``cls`` replaces the
        attrs hook, and calling ``structure(value, cls)`` from it would recurse.
        """
        if _current.get() is None:
            problems = Problems()
            with problems.active():
                result = problems.structure_with(lambda: self._strict_attrs(value, cls), value)
            problems.raise_if_any()
            return result
        return self._strict_attrs(value, cls)

    def _strict_attrs(self, value: Any, cls: type[T]) -> T:
        if not isinstance(value, dict):
            raise Invalid(f"expected a table, got {describe(value)}")
        fields = toml_fields(cls)
        problems = _problems()
        before = len(problems.problems)
        for key in value:
            if key not in fields:
                problems.add_key(key, unknown_key_message(key, fields))
        kwargs: dict[str, Any] = {}
        for key, field in fields.items():
            if key in value:
                raw = value[key]
            elif field.default is not attrs.NOTHING:
                continue
            elif self._is_table(field.type):
                raw = {}
            else:
                problems.add_key(key, "required key is missing")
                continue
            with problems.at_key(key):
                result = problems.structure(self, raw, field.type)
                if result is FAILED:
                    continue
                if field.validator is not None:
                    try:
                        field.validator(None, field, result)
                    except (ValueError, TypeError) as exc:
                        problems.add(str(exc))
                        continue
            kwargs[field.alias] = result
        if len(problems.problems) > before:
            raise _Reported
        try:
            return cls(**kwargs)
        except ConfigError as exc:
            problems.extend_rooted(exc.problems)
            raise _Reported from None

    def _strict_unstructure_factory(self, cls: type) -> Callable[[Any], dict[str, Any]]:
        fields = toml_fields(cls)

        def hook(obj: Any) -> dict[str, Any]:
            out: dict[str, Any] = {}
            for key, field in fields.items():
                value = getattr(obj, field.name)
                if value is not None:
                    out[key] = self.unstructure(value)
            return out

        return hook


converter = StrictConverter()
"""The converter for every config section, core and plugin."""
