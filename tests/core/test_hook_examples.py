"""Every example of ``docs/hooks.md`` runs: each is registered as a plugin of a tiny run and
observed to have been called and to have had its effect."""

from __future__ import annotations

import argparse
import contextlib
import functools
import inspect
import io
import types
from pathlib import Path
from typing import Any

import attrs
import pytest
import torch

from hyper_core import hookimpl
from hyper_core.demo.text import ensure_text_demo
from hyper_core.docgen import example_of, render_hooks
from hyper_core.hookspecs import (
    BUILD_STAGES,
    COMMAND_HOOKS,
    LIFECYCLE_EVENTS,
    REGISTRATION_HOOKS,
)
from hyper_core.testing import isolated_host, run_tiny_training, tiny_text_config
from hyper_core.types import LoadPlan

# The command hooks' examples run in test_export_hook.py.
ALL_HOOKS = REGISTRATION_HOOKS + BUILD_STAGES + LIFECYCLE_EVENTS + COMMAND_HOOKS


class Counter:
    """The ``COUNTER`` of the checkpoint examples."""

    value = 0


class Example:
    """One hook's example, executed as a plugin module, with its calls counted."""

    def __init__(self, name: str, **free_names: Any) -> None:
        self.name = name
        self.calls = 0
        self.results: list[Any] = []
        self.module = types.ModuleType(f"example_{name}")
        self.module.__dict__.update(hookimpl=hookimpl, torch=torch, **free_names)
        source = example_of(name)
        assert source is not None, f"{name} has no example"
        exec(compile(source, f"<example {name}>", "exec"), self.module.__dict__)
        fn = self.module.__dict__[name]
        if inspect.isgeneratorfunction(fn):

            def spy(*args: Any, **kwargs: Any) -> Any:
                self.calls += 1
                return (yield from fn(*args, **kwargs))
        else:

            def spy(*args: Any, **kwargs: Any) -> Any:
                self.calls += 1
                self.results.append(fn(*args, **kwargs))
                return self.results[-1]

        setattr(self.module, name, functools.update_wrapper(spy, fn))


def test_every_example_shown_is_one_this_file_runs() -> None:
    page = render_hooks()
    for name in ALL_HOOKS:
        source = example_of(name)
        assert source is not None, f"{name} has no example"
        first = source.splitlines()[0]
        assert first in page, name
    # the page shows no example that example_of does not know, each as a python block
    assert "Example::" not in page
    assert page.count("```python") == sum(example_of(n) is not None for n in ALL_HOOKS)


def test_registration_examples_register() -> None:
    examples = [Example(name) for name in REGISTRATION_HOOKS]
    host = isolated_host([e.module for e in examples])
    assert [e.calls for e in examples] == [1] * len(examples)
    reg = host.registries
    assert reg.model_adapters.entry("LlavaForConditionalGeneration").name == "llava"
    assert "sorted_padded" in reg.batching_runtimes
    assert "encoder_parallel" in reg.parallel_strategies
    assert "parquet_chat" in reg.dataset_formats
    from hyper_memory_profiler.config import MemoryProfilerConfig

    assert reg.config_sections["memory_profiler"].cls is MemoryProfilerConfig
    command = reg.commands["where"]
    parser = argparse.ArgumentParser()
    command.add_arguments(parser)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert command.run(parser.parse_args(["runs/a"])) == 0
    assert out.getvalue() == "runs/a\n"


@attrs.define
class MyPluginConfig:
    """The ``[my_plugin]`` section the ``build_callbacks`` example reads."""

    enabled: bool = True


class MyPluginSection:
    @hookimpl
    def register_config_sections(self, register: Any) -> None:
        register("my_plugin", MyPluginConfig)


def _not_called(*args: Any, **kwargs: Any) -> Any:
    raise AssertionError("the example takes this branch only for its own strategy")


def _run_examples() -> dict[str, Example]:
    return {
        name: Example(
            name,
            COUNTER=Counter,
            apply_my_tensor_parallel=_not_called,
            dump_debug_state=None,
            attrs=attrs,
        )
        for name in BUILD_STAGES + LIFECYCLE_EVENTS
        if name != "on_train_error" and example_of(name) is not None
    }


def _config(tmp_path: Path, steps: int) -> dict[str, Any]:
    """Two steps per epoch (8 samples), so that an epoch ends within three steps."""
    lines = ensure_text_demo("train").read_text().splitlines()[:8]
    train = tmp_path / "train.jsonl"
    train.write_text("\n".join(lines) + "\n")
    return tiny_text_config(
        tmp_path / "run",
        training={"steps": steps, "global_batch_size": 4, "micro_batch_size": 2},
        data={"train": str(train), "eval": str(ensure_text_demo("eval")), "eval_samples": 4},
        checkpoint={"every_steps": 2, "resume": "auto"},
    )


def test_build_stage_and_lifecycle_examples_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    examples = _run_examples()
    plugins = [MyPluginSection(), *(e.module for e in examples.values())]
    Counter.value = 7
    run = run_tiny_training(_config(tmp_path, 5), plugins=plugins)
    out = capsys.readouterr().out
    called = {name for name, e in examples.items() if e.calls}
    assert called == set(examples) - {"on_load_checkpoint"}, set(examples) - called
    t = run.trainer

    assert "rank 0 of 1 on cpu" in out  # setup_distributed
    assert "meta init: False, sharded load: False" in out  # plan_load (one process)
    assert t.load_plan == LoadPlan()
    assert not t.unwrapped_model.get_input_embeddings().weight.requires_grad  # build_model
    assert t.loss_fn.__qualname__ == "build_loss.<locals>.loss_fn"
    assert t.assets.tokenizer.padding_side == "left"
    assert t.transform.__name__ == "without_system_turns"
    assert f"{len(t.datasets.train)} training samples" in out  # build_dataset
    assert t.collate_fn.__name__ == "<lambda>"
    assert f"{t.dataloaders.train.steps_per_epoch} steps per epoch" in out
    assert t.get_batch.__name__ == "get_batch_bf16"
    # compute_train_iters: at most two epochs of two steps, though 5 steps are configured
    assert t.dataloaders.train.steps_per_epoch == 2 and t.train_iters == 4
    assert isinstance(t.optimizer, torch.optim.SGD)
    assert t.optimizer.param_groups[0]["momentum"] == 0.9
    assert isinstance(t.lr_scheduler, torch.optim.lr_scheduler.StepLR)
    with t.training_context() as ctx:
        assert isinstance(ctx, torch.autocast) and torch.get_autocast_dtype("cpu") == torch.float16
    assert f"checkpoints go to {t.checkpointer.root}" in out
    assert "parameters" in out  # on_stage_end
    assert "training 4 steps from step 0" in out  # on_train_begin
    assert "epoch 0\n" in out and "epoch 1\n" in out  # on_epoch_begin
    assert "epoch 0 done at step 2" in out  # on_epoch_end
    assert "step 1: 0 images" in out  # on_step_begin
    assert "eval loss" in out  # on_evaluate
    assert run.eval_metrics and all("best_eval_loss" in m for m in run.eval_metrics)
    assert [m["lr_x1000"] for m in run.metrics if "lr" in m] == [
        m["lr"] * 1000 for m in run.metrics if "lr" in m
    ]  # on_log
    assert "finished after 4 steps" in out  # on_train_end
    my_run = [r for r in examples["build_callbacks"].results if r is not None]
    assert len(my_run) == 1 and my_run[0].steps == 4  # build_callbacks' object saw the steps

    # on_save_checkpoint stored the counter; on_load_checkpoint gives it back on resume.
    Counter.value = 0
    examples = _run_examples()
    run_tiny_training(
        _config(tmp_path, 6), plugins=[MyPluginSection(), *(e.module for e in examples.values())]
    )
    assert examples["on_load_checkpoint"].calls == 1
    assert Counter.value == 7


def test_on_train_error_example_runs_and_the_error_propagates(tmp_path: Path) -> None:
    dumped: list[str] = []

    def dump_debug_state(trainer: Any, reason: str) -> None:
        dumped.append(reason)

    class Fail:
        @hookimpl
        def on_step_begin(self) -> None:
            raise RuntimeError("boom")

    example = Example("on_train_error", dump_debug_state=dump_debug_state)
    with pytest.raises(RuntimeError, match="boom"):
        run_tiny_training(tiny_text_config(tmp_path), plugins=[example.module, Fail()], steps=1)
    assert example.calls == 1 and dumped == ["RuntimeError('boom')"]
