"""``hyper-train new-plugin``: scaffold a plugin or model-adapter distribution.

The files are package data under ``templates/`` rendered with :class:`string.Template`
(``${package}``, ``${ident}``, ...; ``$$`` is a literal ``$``). Standard library only: the
command must not import torch or transformers.
"""

from __future__ import annotations

import keyword
import os
import re
import string
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from ..errors import UserError

KINDS = ("plugin", "adapter")

_NAME = re.compile(r"[a-z][a-z0-9]*(?:-[a-z0-9]+)*")
#: Longest NAME (keeps the generated code within its 100-column lint limit).
MAX_NAME_LENGTH = 30
#: Names whose import package would shadow or mimic hyper-train's own (``hyper_core``).
_RESERVED = {"core", "train"}

#: Per kind: (output path, template path under ``templates/``). Output paths are templates too.
FILES: dict[str, tuple[tuple[str, str], ...]] = {
    "plugin": (
        ("pyproject.toml", "common/pyproject.toml.tmpl"),
        ("README.md", "plugin/README.md.tmpl"),
        ("${package}/__init__.py", "common/__init__.py.tmpl"),
        ("${package}/plugin.py", "plugin/plugin.py.tmpl"),
        ("tests/test_${ident}.py", "plugin/test_plugin.py.tmpl"),
    ),
    "adapter": (
        ("pyproject.toml", "common/pyproject.toml.tmpl"),
        ("README.md", "adapter/README.md.tmpl"),
        ("${package}/__init__.py", "common/__init__.py.tmpl"),
        ("${package}/plugin.py", "adapter/plugin.py.tmpl"),
        ("${package}/adapter.py", "adapter/adapter.py.tmpl"),
        ("tests/test_${ident}.py", "adapter/test_adapter.py.tmpl"),
    ),
    # ``--kind adapter --vision``: a vision-language adapter, after the LLaVA example.
    "adapter-vision": (
        ("pyproject.toml", "common/pyproject.toml.tmpl"),
        ("README.md", "adapter_vision/README.md.tmpl"),
        ("${package}/__init__.py", "common/__init__.py.tmpl"),
        ("${package}/plugin.py", "adapter_vision/plugin.py.tmpl"),
        ("${package}/adapter.py", "adapter_vision/adapter.py.tmpl"),
        ("${package}/processor.py", "adapter_vision/processor.py.tmpl"),
        ("${package}/tokens.py", "adapter_vision/tokens.py.tmpl"),
        ("tests/test_${ident}.py", "adapter_vision/test_adapter.py.tmpl"),
    ),
    # ``--kind adapter --vision --tiles``: a tile-based vision-language adapter (InternVL)
    # whose vision-encoder methods are the core's defaults.
    "adapter-vision-tiles": (
        ("pyproject.toml", "common/pyproject.toml.tmpl"),
        ("README.md", "adapter_tiles/README.md.tmpl"),
        ("${package}/__init__.py", "common/__init__.py.tmpl"),
        ("${package}/plugin.py", "adapter_tiles/plugin.py.tmpl"),
        ("${package}/adapter.py", "adapter_tiles/adapter.py.tmpl"),
        ("${package}/processor.py", "adapter_tiles/processor.py.tmpl"),
        ("${package}/tokens.py", "adapter_tiles/tokens.py.tmpl"),
        ("tests/test_${ident}.py", "adapter_vision/test_adapter.py.tmpl"),
    ),
}


@dataclass(frozen=True)
class PluginNames:
    """The names derived from ``NAME``: ``my-thing`` → ``hyper-train-my-thing``,
    ``hyper_my_thing``, ``my_thing``, ``MyThing``."""

    name: str
    distribution: str
    package: str
    ident: str
    class_prefix: str

    @classmethod
    def from_name(cls, name: str) -> PluginNames:
        """Validate ``name``: lowercase letters, digits and single hyphens, starting with a letter,
        at most :data:`MAX_NAME_LENGTH` characters."""
        if name.startswith("hyper-train-") or name.startswith("hyper-"):
            short = name.removeprefix("hyper-train-").removeprefix("hyper-")
            raise UserError(
                f"new-plugin: give NAME without the prefix ({short!r}): "
                f"the distribution is named hyper-train-NAME"
            )
        if not _NAME.fullmatch(name):
            raise UserError(
                f"new-plugin: bad NAME {name!r}: use lowercase letters, digits and single "
                "hyphens, starting with a letter (e.g. 'my-adapter')"
            )
        if len(name) > MAX_NAME_LENGTH:
            raise UserError(
                f"new-plugin: NAME {name!r} is longer than {MAX_NAME_LENGTH} characters"
            )
        if name in _RESERVED:
            raise UserError(f"new-plugin: NAME {name!r} is reserved (hyper_{name} is the core's)")
        ident = name.replace("-", "_")
        prefix = "".join(part.capitalize() for part in name.split("-"))
        return cls(name, f"hyper-train-{name}", f"hyper_{ident}", ident, prefix)

    def substitutions(self, kind: str) -> dict[str, str]:
        """The template variables."""
        return {
            "name": self.name,
            "distribution": self.distribution,
            "package": self.package,
            "ident": self.ident,
            "class_prefix": self.class_prefix,
            "kind": kind,
        }


def _check(names: PluginNames, kind: str, vision: bool, tiles: bool) -> None:
    if kind not in KINDS:
        raise UserError(f"new-plugin: --kind must be one of {', '.join(KINDS)}, got {kind!r}")
    if vision and kind != "adapter":
        raise UserError("new-plugin: --vision goes with --kind adapter")
    if tiles and not vision:
        raise UserError("new-plugin: --tiles goes with --kind adapter --vision")
    if kind == "plugin":
        from ..config.schema import CORE_SECTIONS  # attrs only, no torch

        if names.ident in CORE_SECTIONS or keyword.iskeyword(names.ident):
            raise UserError(
                f"new-plugin: NAME {names.name!r} can't name the plugin's config section "
                f"[{names.ident}] (a core section or a Python keyword); choose another"
            )


def render(name: str, kind: str, *, vision: bool = False, tiles: bool = False) -> dict[str, str]:
    """The scaffold's files, relative path → text (nothing written); ``vision``: a
    vision-language adapter (``--kind adapter --vision``); ``tiles``: a tile-based one
    (``--tiles``)."""
    names = PluginNames.from_name(name)
    _check(names, kind, vision, tiles)
    subs = names.substitutions(kind)
    templates = resources.files(__name__) / "templates"
    files = {}
    variant = kind + ("-vision" if vision else "") + ("-tiles" if tiles else "")
    for out, src in FILES[variant]:
        text = (templates / src).read_text(encoding="utf-8")
        files[string.Template(out).substitute(subs)] = string.Template(text).substitute(subs)
    return files


def scaffold(
    name: str,
    kind: str,
    out_dir: str | os.PathLike[str] = ".",
    *,
    vision: bool = False,
    tiles: bool = False,
) -> Path:
    """Write ``out_dir/hyper-train-NAME/``; returns that folder.

    Raises :class:`UserError` for a bad name or kind, or when the folder exists and isn't empty.
    """
    files = render(name, kind, vision=vision, tiles=tiles)
    target = Path(out_dir) / PluginNames.from_name(name).distribution
    if target.exists() and (not target.is_dir() or any(target.iterdir())):
        raise UserError(f"new-plugin: {target} already exists and is not empty; not overwriting")
    for rel, text in files.items():
        path = target / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    return target


__all__ = ["FILES", "KINDS", "PluginNames", "render", "scaffold"]
