"""Every stage and event fires in the order of ``BUILD_STAGES`` (docs/architecture.md); stages
can be replaced and wrapped; every hook parameter has a real type."""

from __future__ import annotations

import ast
import inspect
import typing
from pathlib import Path
from typing import Any

import pytest
import torch

from hyper_core import hookimpl
from hyper_core.demo.text import ensure_text_demo
from hyper_core.hookspecs import BUILD_STAGES, LIFECYCLE_EVENTS
from hyper_core.testing import HookRecorder, run_tiny_training, tiny_text_config


def test_every_hook_has_a_docstring() -> None:
    from hyper_core import hookspecs

    for name in BUILD_STAGES + LIFECYCLE_EVENTS + hookspecs.REGISTRATION_HOOKS:
        doc = getattr(hookspecs, name).__doc__
        assert doc and len(doc.strip()) > 20, name


def _type_checking_namespace() -> dict[str, Any]:
    """hookspecs' globals plus what it imports under ``TYPE_CHECKING``."""
    from hyper_core import hookspecs

    tree = ast.parse(Path(hookspecs.__file__).read_text())
    block = next(
        node
        for node in tree.body
        if isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING"
    )
    namespace = dict(vars(hookspecs))
    exec(
        compile(ast.Module(body=block.body, type_ignores=[]), hookspecs.__file__, "exec"), namespace
    )
    return namespace


#: Parameters that are ``Any`` by design: a stage's result can be anything.
_ANY_ALLOWED = {("on_stage_end", "result")}


def test_every_hook_parameter_and_result_has_a_real_type() -> None:
    from hyper_core import hookspecs

    namespace = _type_checking_namespace()
    for name in BUILD_STAGES + LIFECYCLE_EVENTS + hookspecs.REGISTRATION_HOOKS:
        fn = getattr(hookspecs, name)
        hints = typing.get_type_hints(fn, globalns=namespace)  # every annotation resolves
        params = inspect.signature(fn).parameters
        assert set(hints) == {*params, "return"}, name
        for param, hint in hints.items():
            if (name, param) not in _ANY_ALLOWED:
                assert hint is not Any, f"{name}({param}) is Any"


def test_docstrings_name_the_calls_the_core_makes() -> None:
    from hyper_core import hookspecs
    from hyper_core.data import DatasetFormat
    from hyper_core.types import GetBatch

    # the core calls a dataset format as DatasetFormat says, and get_batch per micro-batch
    fmt_params = list(inspect.signature(DatasetFormat.__call__).parameters)[1:]
    assert fmt_params == ["path", "options", "base_dir"]
    assert "fn(path, options, base_dir)" in (hookspecs.register_dataset_formats.__doc__ or "")
    assert list(inspect.signature(GetBatch.__call__).parameters)[1:] == ["micro_batch"]
    assert "get_batch(micro_batch) -> (model_inputs, loss_inputs)" in (
        hookspecs.build_get_batch.__doc__ or ""
    )


class PlainState:
    """Stores the plain data ``on_save_checkpoint`` documents; records what comes back."""

    def __init__(self) -> None:
        self.loaded: dict[str, Any] = {}

    @hookimpl
    def on_save_checkpoint(self, plugin_state: dict[str, Any]) -> None:
        plugin_state["plain"] = {"t": torch.arange(3), "l": [1, "a", None, True, 2.5], "u": (1, 2)}

    @hookimpl
    def on_load_checkpoint(self, plugin_state: dict[str, Any]) -> None:
        self.loaded = plugin_state["plain"]


def test_plugin_state_of_plain_data_comes_back_on_resume(tmp_path: Path) -> None:
    cfg = tiny_text_config(tmp_path, checkpoint={"resume": "auto"})
    run_tiny_training(cfg, plugins=[PlainState()], steps=1)
    plugin = PlainState()
    run_tiny_training(cfg, plugins=[plugin], steps=2)
    assert torch.equal(plugin.loaded["t"], torch.arange(3))
    assert plugin.loaded["l"] == [1, "a", None, True, 2.5] and plugin.loaded["u"] == (1, 2)


def test_the_hookspecs_import_neither_torch_nor_transformers() -> None:
    import subprocess
    import sys

    code = (
        "import sys, hyper_core.hookspecs, hyper_core.docgen\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'transformers')))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    )
    assert out.stdout.strip() == "[]", out.stdout


def test_stages_and_events_fire_in_order(tmp_path: Path) -> None:
    rec = HookRecorder()
    cfg = tiny_text_config(
        tmp_path / "run",
        training={"steps": 1, "global_batch_size": 4, "micro_batch_size": 4},
        data={
            "eval": str(ensure_text_demo("eval")),
            "eval_samples": 4,
        },
    )
    run_tiny_training(cfg, plugins=[rec])
    names = rec.names
    stages = [n for n in names if n in BUILD_STAGES]
    assert stages == list(BUILD_STAGES)
    # on_stage_end follows every stage, with the stage's name.
    for i, (name, _) in enumerate(rec.calls[: 2 * len(BUILD_STAGES)]):
        if i % 2 == 1:
            assert name == "on_stage_end"
            assert rec.calls[i][1]["stage"] == rec.calls[i - 1][0]
    events = [n for n in names if n in LIFECYCLE_EVENTS and n != "on_stage_end"]
    assert events == [
        "on_train_begin",
        "on_epoch_begin",
        "on_step_begin",
        "on_micro_step_end",
        "on_step_end",
        "on_log",
        "on_save_checkpoint",
        "on_evaluate",
        "on_train_end",
    ]
    step_end = dict(rec.calls[names.index("on_step_end")][1])
    assert step_end["state"].global_step >= 1 and step_end["loss"] > 0

    # A second run resumes from the checkpoint: on_load_checkpoint fires once.
    rec2 = HookRecorder()
    cfg["checkpoint"] = {"resume": "auto"}
    cfg["training"]["steps"] = 2
    run_tiny_training(cfg, plugins=[rec2])
    assert rec2.names.count("on_load_checkpoint") == 1
    assert rec2.names.index("on_load_checkpoint") < rec2.names.index("on_train_begin")


class Boom(RuntimeError):
    pass


class FailInStep:
    @hookimpl
    def on_step_begin(self, state: Any) -> None:
        if state.global_step == 1:
            raise Boom("step 2 failed")


def test_train_error_fires_and_the_original_exception_propagates(tmp_path: Path) -> None:
    rec = HookRecorder()
    with pytest.raises(Boom):
        run_tiny_training(tiny_text_config(tmp_path), plugins=[rec, FailInStep()], steps=3)
    errors = [kw for name, kw in rec.calls if name == "on_train_error"]
    assert len(errors) == 1 and isinstance(errors[0]["exc"], Boom)
    assert "on_train_end" not in rec.names


class ReplaceOptimizer:
    @hookimpl
    def build_optimizer(self, model: torch.nn.Module) -> torch.optim.Optimizer:
        return torch.optim.SGD(model.parameters(), lr=0.1)


class WrapModel:
    def __init__(self) -> None:
        self.seen: list[int] = []

    @hookimpl(wrapper=True)
    def build_model(self) -> Any:
        model = yield
        self.seen.append(sum(p.numel() for p in model.parameters()))
        model.get_input_embeddings().requires_grad_(False)
        return model


def test_a_plugin_replaces_a_stage(tmp_path: Path) -> None:
    run = run_tiny_training(tiny_text_config(tmp_path), plugins=[ReplaceOptimizer()], steps=1)
    assert isinstance(run.trainer.optimizer, torch.optim.SGD)


def test_a_plugin_wraps_a_stage(tmp_path: Path) -> None:
    wrap = WrapModel()
    run = run_tiny_training(tiny_text_config(tmp_path), plugins=[wrap], steps=1)
    assert len(wrap.seen) == 1 and wrap.seen[0] > 0
    emb = run.trainer.model.get_input_embeddings().weight
    assert not emb.requires_grad
    # The frozen embedding is not in the optimizer.
    params = {id(p) for g in run.trainer.optimizer.param_groups for p in g["params"]}
    assert id(emb) not in params
