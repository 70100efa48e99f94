"""The strict cattrs converter behind configs: no coercion, exact ``$.a.b[i]`` error paths.

cattrs structures with detailed validation and forbids extra keys; every problem in the whole
input comes back as one :class:`~hyper_core.errors.ConfigError` of ``(path, message)`` pairs, read
from cattrs' validation notes. Plugins structure their own sections with the same
:data:`converter`::

    section = converter.structure_at(raw, MySection, path="$.my_plugin")
"""

from __future__ import annotations

import copy
import datetime
import difflib
import functools
import json
import re
import types
import typing
from collections.abc import Callable, Iterable
from typing import Any, Literal, TypeVar

import attrs
import cattrs
from cattrs.cols import list_structure_factory
from cattrs.errors import ClassValidationError, ForbiddenExtraKeysError, IterableValidationError
from cattrs.gen import make_dict_structure_fn, mapping_structure_factory, override

from hyper_core.errors import ConfigError

T = TypeVar("T")

_BARE_KEY = re.compile(r"[A-Za-z0-9_-]+")
_ABSENT: Any = object()


class Invalid(ValueError):
    """Raised by a structure hook: the value at the current path is wrong (``msg`` says how)."""

    def __init__(self, msg: str) -> None:
        super().__init__(msg)
        self.msg = msg


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
    if cl is dict or origin is dict or _is_attrs_class(cl):
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


def _is_attrs_class(cl: Any) -> bool:
    return isinstance(cl, type) and attrs.has(cl)


def _is_union(cl: Any) -> bool:
    return typing.get_origin(cl) in (typing.Union, types.UnionType)


def _origin_is(*origins: Any) -> Callable[[Any], bool]:
    return lambda cl: cl in origins or typing.get_origin(cl) in origins


def _child(value: Any, key: Any) -> Any:
    """``value[key]`` for locating a message's value, or a placeholder where there is none."""
    try:
        return value[key]
    except (KeyError, IndexError, TypeError):
        return _ABSENT


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
        super().__init__(detailed_validation=True, forbid_extra_keys=True)
        self._tables: dict[type, Callable[[Any, Any], Any]] = {}
        for cl, hook in (
            (bool, self._strict_bool),
            (int, self._strict_int),
            (float, self._strict_float),
            (str, self._strict_str),
        ):
            self.register_structure_hook(cl, hook)
        self.register_structure_hook_func(
            lambda cl: cl is Any or cl is object, lambda value, _: copy.deepcopy(value)
        )
        self.register_structure_hook_factory(_origin_is(list), self._strict_list_factory)
        self.register_structure_hook_factory(_origin_is(dict), self._strict_dict_factory)
        self.register_structure_hook_func(_is_union, self._strict_union)
        self.register_structure_hook_func(
            lambda cl: typing.get_origin(cl) is Literal, self._strict_literal
        )
        self.register_structure_hook_factory(_is_attrs_class, self._strict_table_factory)
        self.register_unstructure_hook_factory(_is_attrs_class, self._strict_unstructure_factory)

    def structure(self, obj: Any, cl: Any) -> Any:
        """Structure ``obj`` as ``cl``; raise one ConfigError for all problems."""
        return self.structure_at(obj, cl)

    def structure_at(
        self, obj: Any, cl: type[T] | Any, path: str = "$", source: str | None = None
    ) -> T:
        """Structure ``obj`` whose location is ``path``; raise ConfigError with every problem."""
        return self._checked(lambda: self.get_structure_hook(cl)(obj, cl), obj, path, source)

    def structure_table(self, value: Any, cls: type[T]) -> T:
        """Structure a table into the attrs class ``cls`` with the strict field rules.

        For custom hooks that preprocess a table: registering a hook for ``cls`` replaces the
        attrs hook, and calling ``structure(value, cls)`` from it would recurse.
        """
        if cls not in self._tables:  # the registered hook is cached by cattrs, this one here
            self._tables[cls] = self._strict_table_factory(cls)
        return self._checked(lambda: self._tables[cls](value, cls), value)

    def _checked(
        self, func: Callable[[], T], obj: Any, path: str = "$", source: str | None = None
    ) -> T:
        try:
            return func()
        except Exception as exc:
            problems = self._problems(exc, path, obj)
        raise ConfigError(problems, source=source)

    def _problems(self, exc: BaseException, path: str, value: Any) -> list[tuple[str, str]]:
        """The ``(path, message)`` problems of a structuring error on ``value`` at ``path``.

        Walks cattrs' validation errors by their notes; re-raises an exception that is no
        config problem (a bug in a hook).
        """
        if isinstance(exc, ClassValidationError):
            return self._class_problems(exc, path, value)
        if isinstance(exc, IterableValidationError):
            out: list[tuple[str, str]] = []
            with_notes, without = exc.group_exceptions()
            for sub, note in with_notes:
                index = note.index
                where = join_key(path, index) if isinstance(index, str) else f"{path}[{index}]"
                out += self._problems(sub, where, _child(value, index))
            for sub in without:
                out += self._problems(sub, path, value)
            return out
        if isinstance(exc, Invalid):
            return [(path, exc.msg)]
        if isinstance(exc, ConfigError):
            return [(path + p[1:] if p.startswith("$") else p, m) for p, m in exc.problems]
        if isinstance(exc, (ValueError, TypeError)):
            return [(path, f"invalid value {show(value)}: {exc}")]
        raise exc

    def _class_problems(
        self, exc: ClassValidationError, path: str, value: Any
    ) -> list[tuple[str, str]]:
        fields = toml_fields(exc.cl)
        keys = {f.name: key for key, f in fields.items()}
        value = value if isinstance(value, dict) else {}  # a missing table is read as {}
        with_notes, without = exc.group_exceptions()
        out = [
            (join_key(path, key), unknown_key_message(key, fields))
            for sub in without
            if isinstance(sub, ForbiddenExtraKeysError)
            for key in value
            if key in sub.extra_fields
        ]
        for sub, note in with_notes:
            key = keys[note.name]
            if isinstance(sub, KeyError) and key not in value:
                out.append((join_key(path, key), "required key is missing"))
            else:
                out += self._problems(sub, join_key(path, key), _child(value, key))
        for sub in without:
            if not isinstance(sub, ForbiddenExtraKeysError):
                out += self._problems(sub, path, value)
        return out

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

    def _strict_union(self, value: Any, cl: Any) -> Any:
        args = typing.get_args(cl)
        if value is None and type(None) in args:
            return None
        options = [a for a in args if a is not type(None)]
        if len(options) == 1:
            return self.get_structure_hook(options[0])(value, options[0])
        for option in options:
            try:
                return self.get_structure_hook(option)(value, option)
            except (ConfigError, cattrs.BaseValidationError, TypeError, ValueError):
                continue
        names = " or ".join(type_name(o) for o in options)
        raise Invalid(f"expected {names}, got {describe(value)}")

    def _strict_list_factory(self, cl: Any) -> Callable[[Any, Any], list[Any]]:
        elements = list_structure_factory(cl, self)
        untyped = (typing.get_args(cl) or (Any,))[0] in (Any, object)  # cattrs copies shallowly

        def hook(value: Any, _: Any) -> list[Any]:
            if not isinstance(value, (list, tuple)):
                raise Invalid(f"expected an array, got {describe(value)}")
            return copy.deepcopy(list(value)) if untyped else elements(value, cl)

        return hook

    def _strict_dict_factory(self, cl: Any) -> Callable[[Any, Any], dict[str, Any]]:
        _, value_type = typing.get_args(cl) or (str, Any)
        items = mapping_structure_factory(cl, self, key_type=str, val_type=value_type)

        def hook(value: Any, _: Any) -> dict[str, Any]:
            if not isinstance(value, dict):
                raise Invalid(f"expected a table, got {describe(value)}")
            bad = [
                Invalid(f"keys must be strings, got {describe(k)}")
                for k in value
                if not isinstance(k, str)
            ]
            if bad:
                raise IterableValidationError(f"While structuring {cl!r}", bad, cl)
            return items(value, cl)

        return hook

    def _strict_table_factory(self, cls: type) -> Callable[[Any, Any], Any]:
        """cattrs' generated attrs hook, with TOML keys, field validators run per field, and
        a missing table (a field typed by an attrs class without a default) read as ``{}``."""
        overrides: dict[str, Any] = {}
        tables = []
        toml = {f.name: key for key, f in toml_fields(cls).items()}
        for field in attrs.fields(cls):
            if field.name not in toml:
                overrides[field.name] = override(omit=True)
                continue
            rename = toml[field.name] if toml[field.name] != field.name else None
            hook = None
            if field.validator is not None:
                hook = self._strict_validating(field)
            overrides[field.name] = override(rename=rename, struct_hook=hook)
            if field.default is attrs.NOTHING and self._is_table(field.type):
                tables.append(toml[field.name])
        generated = make_dict_structure_fn(cls, self, **overrides)

        def table(value: Any, _: Any) -> Any:
            if not isinstance(value, dict):
                raise Invalid(f"expected a table, got {describe(value)}")
            missing = {key: {} for key in tables if key not in value}
            return generated({**value, **missing} if missing else value, cls)

        table.is_table_hook = True  # type: ignore[attr-defined]
        return table

    def _strict_validating(self, field: attrs.Attribute) -> Callable[[Any, Any], Any]:
        def hook(value: Any, cl: Any) -> Any:
            result = self.get_structure_hook(cl)(value, cl)
            try:
                field.validator(None, field, result)
            except (ValueError, TypeError) as exc:
                raise Invalid(str(exc)) from None
            return result

        return hook

    def _is_table(self, cl: Any) -> bool:
        """True when ``cl`` is structured from a table by the attrs hook (a missing one is {})."""
        return _is_attrs_class(cl) and getattr(self.get_structure_hook(cl), "is_table_hook", False)

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
