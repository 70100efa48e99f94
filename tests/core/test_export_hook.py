"""The ``export_checkpoint`` command hook: documented with a runnable example, typed, and
``hyper-train export`` asks it before writing the full model."""

from __future__ import annotations

import ast
import types
import typing
from pathlib import Path
from typing import Any

import attrs
import pytest

from hyper_core import hookimpl, hookspecs
from hyper_core.docgen import example_of, render_hooks
from hyper_core.export import ExportOptions
from hyper_core.testing import isolated_host, run_tiny_training, tiny_text_config


def _type_checking_namespace() -> dict[str, Any]:
    """hookspecs' globals plus what it imports under ``TYPE_CHECKING``."""
    tree = ast.parse(Path(hookspecs.__file__).read_text())
    block = next(
        n for n in tree.body if isinstance(n, ast.If) and ast.unparse(n.test) == "TYPE_CHECKING"
    )
    namespace = dict(vars(hookspecs))
    exec(
        compile(ast.Module(body=block.body, type_ignores=[]), hookspecs.__file__, "exec"), namespace
    )
    return namespace


def test_command_hooks_are_documented_and_typed() -> None:
    page = render_hooks()
    namespace = _type_checking_namespace()
    for name in hookspecs.COMMAND_HOOKS:
        assert f"### `{name}(" in page, name
        source = example_of(name)
        assert source is not None and f"def {name}(" in source, name
        assert source.splitlines()[1] in page, name
        hints = typing.get_type_hints(getattr(hookspecs, name), globalns=namespace)
        assert all(h is not Any for h in hints.values()), name


@attrs.define
class MyPluginConfig:
    enabled: bool = True


class MyPluginSection:
    @hookimpl
    def register_config_sections(self, register: Any) -> None:
        register("my_plugin", MyPluginConfig)


@pytest.mark.parametrize("enabled", [True, False])
def test_export_example_takes_the_runs_of_its_plugin(tmp_path: Path, enabled: bool) -> None:
    """The docs' example, as a plugin of ``hyper-train export``: it writes its format for its
    plugin's runs and leaves the others to the core."""
    written: list[tuple[Path, Path]] = []
    module = types.ModuleType("example_export_checkpoint")
    module.__dict__.update(
        hookimpl=hookimpl, write_my_format=lambda ckpt, out: written.append((ckpt, out))
    )
    exec(compile(example_of("export_checkpoint") or "", "<example>", "exec"), module.__dict__)
    raw = tiny_text_config(tmp_path / "run", my_plugin={"enabled": enabled})
    host = isolated_host([MyPluginSection(), module])
    run_tiny_training(raw, plugins=[MyPluginSection()], steps=1)
    from hyper_core.config import load_config_dict

    config = load_config_dict(raw, sections=host.registries.config_sections)
    ckpt = tmp_path / "run" / "checkpoints" / "step-1"
    out = host.call_stage(
        "export_checkpoint",
        config=config,
        registries=host.registries,
        checkpoint=ckpt,
        out_dir=tmp_path / "out",
        options=ExportOptions(),
    )
    assert (out, written) == (
        (tmp_path / "out", [(ckpt, tmp_path / "out")]) if enabled else (None, [])
    )


@pytest.mark.parametrize("enabled", [True, False])
def test_load_example_takes_the_checkpoints_of_its_plugin(tmp_path: Path, enabled: bool) -> None:
    """The docs' ``load_checkpoint_model`` example: it loads its plugin's checkpoints and leaves
    the others to the core."""
    module = types.ModuleType("example_load_checkpoint_model")
    module.__dict__.update(
        hookimpl=hookimpl, load_my_format=lambda config, registries, ckpt: ("adapter", ckpt)
    )
    exec(compile(example_of("load_checkpoint_model") or "", "<example>", "exec"), module.__dict__)
    host = isolated_host([MyPluginSection(), module])
    from hyper_core.config import load_config_dict

    raw = tiny_text_config(tmp_path / "run", my_plugin={"enabled": enabled})
    config = load_config_dict(raw, sections=host.registries.config_sections)
    loaded = host.call_stage(
        "load_checkpoint_model",
        config=config,
        registries=host.registries,
        checkpoint=tmp_path / "step-1",
    )
    assert loaded == (("adapter", tmp_path / "step-1") if enabled else None)
