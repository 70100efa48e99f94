"""``build_callbacks`` is a collecting stage: every plugin's per-run object is registered for
its run only, receives the run's events, and is unregistered when the run ends (also when it
fails); the batching runtime's vision filler is decided when the runtime is built."""

from __future__ import annotations

import ast
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from hyper_core import hookimpl
from hyper_core.errors import ConfigError
from hyper_core.testing import isolated_host, run_tiny_training, tiny_text_config
from hyper_core.trainer.trainer import Trainer

REPO = Path(__file__).resolve().parents[2]


class StepCounter:
    """A per-run object: everything it knows is about its own run."""

    def __init__(self, tag: str) -> None:
        self.tag = tag
        self.stages: list[str] = []
        self.steps: list[int] = []
        self.ended = False

    @hookimpl
    def on_stage_end(self, stage: str) -> None:
        self.stages.append(stage)

    @hookimpl
    def on_step_end(self, state: Any) -> None:
        self.steps.append(state.global_step)

    @hookimpl
    def on_train_end(self) -> None:
        self.ended = True


class CounterPlugin:
    """A plugin (one per process) that gives each run a new :class:`StepCounter`."""

    def __init__(self) -> None:
        self.made: list[StepCounter] = []

    @hookimpl
    def build_callbacks(self, config: Any, dist: Any, adapter: Any) -> StepCounter:
        counter = StepCounter(Path(config.run.output_dir).name)
        self.made.append(counter)
        return counter


class NothingPlugin:
    """Returns None (no per-run object) and a list (two): both are accepted."""

    @hookimpl
    def build_callbacks(self) -> list[StepCounter | None]:
        return [StepCounter("a"), None, StepCounter("b")]


class NonePlugin:
    @hookimpl
    def build_callbacks(self) -> None:
        return None


def test_each_run_gets_its_own_object_registered_for_that_run(tmp_path: Path) -> None:
    plugin = CounterPlugin()
    host = isolated_host([plugin])
    first = run_tiny_training(tiny_text_config(tmp_path / "one", training={"steps": 2}), host=host)
    second = run_tiny_training(tiny_text_config(tmp_path / "two", training={"steps": 3}), host=host)
    one, two = plugin.made
    assert one is not two
    assert (one.tag, one.steps, one.ended) == ("one", [1, 2], True)
    assert (two.tag, two.steps, two.ended) == ("two", [1, 2, 3], True)  # nothing of run one
    # Registered right after setup_distributed: on_stage_end of build_callbacks and later.
    assert one.stages[:3] == ["build_callbacks", "plan_load", "build_model"]
    assert one.stages[-1] == "build_checkpointer"
    for run, counter in ((first, one), (second, two)):
        assert counter in run.trainer.callbacks
        assert not host.pm.is_registered(counter)  # unregistered after its run
    assert host.pm.is_registered(plugin)


def test_none_and_lists_are_accepted(tmp_path: Path) -> None:
    host = isolated_host([NothingPlugin(), NonePlugin()])
    run = run_tiny_training(tiny_text_config(tmp_path / "r", training={"steps": 1}), host=host)
    counters = [cb for cb in run.trainer.callbacks if isinstance(cb, StepCounter)]
    assert [c.tag for c in counters] == ["a", "b"]
    assert all(c.steps == [1] for c in counters)


def test_unregistered_when_setup_fails(tmp_path: Path) -> None:
    plugin = CounterPlugin()
    host = isolated_host([plugin])
    from hyper_core.config import load_config_dict

    raw = tiny_text_config(tmp_path / "bad", model={"freeze": ["vision"]})
    config = load_config_dict(raw, sections=host.registries.config_sections)
    with pytest.raises(ConfigError, match=r"\$\.model\.freeze"):
        Trainer(config, host).setup()
    (counter,) = plugin.made
    assert counter.stages == ["build_callbacks", "plan_load"]  # build_model failed
    assert not host.pm.is_registered(counter)


def _trainer_for_filler(world_size: int, encoder: bool, callbacks: list[Any]) -> Trainer:
    trainer = Trainer.__new__(Trainer)
    plan = SimpleNamespace(vision_encoder=object() if encoder else None)
    trainer.dist = SimpleNamespace(world_size=world_size)
    trainer.adapter = SimpleNamespace(parallel_plan=lambda model: plan)
    trainer.strategy = None
    trainer.model = object()
    trainer.callbacks = callbacks
    return trainer


def test_filler_only_when_ranks_must_all_run_the_encoder() -> None:
    balancer_run = SimpleNamespace(runs_vision_encoder_on_every_rank=True)
    assert _trainer_for_filler(2, True, [])._needs_filler()
    assert _trainer_for_filler(2, True, [object()])._needs_filler()
    assert not _trainer_for_filler(1, True, [])._needs_filler()
    assert not _trainer_for_filler(2, False, [])._needs_filler()
    assert not _trainer_for_filler(2, True, [balancer_run])._needs_filler()


def test_runtime_is_built_with_its_filler(tmp_path: Path) -> None:
    from hyper_core.batching.resolve import resolve_runtime
    from hyper_core.batching.types import SampleFeatures
    from hyper_core.config import load_config_dict

    host = isolated_host()
    config = load_config_dict(tiny_text_config(tmp_path), sections=host.registries.config_sections)
    filler = SampleFeatures.__new__(SampleFeatures)
    adapter = SimpleNamespace(default_batching="packed", vision_filler=lambda assets: filler)
    assets = SimpleNamespace(pad_token_id=0)
    with_filler = resolve_runtime(config, adapter, assets, host.registries, vision_filler=True)
    assert with_filler.vision_filler is filler and with_filler.options.vision_filler is filler
    plain = resolve_runtime(config, adapter, assets, host.registries)
    assert plain.vision_filler is None


def _module_level_weak_dicts(path: Path) -> list[str]:
    tree = ast.parse(path.read_text())
    found = []
    for node in tree.body:
        value = node.value if isinstance(node, ast.Assign | ast.AnnAssign) else None
        if isinstance(value, ast.Call) and "Weak" in ast.unparse(value.func):
            found.append(f"{path.relative_to(REPO)}:{node.lineno}")
    return found


def test_no_plugin_keeps_per_run_state_at_module_level() -> None:
    files = sorted((REPO / "plugins").glob("*/hyper_*/*.py"))
    files += sorted((REPO / "adapters").glob("*/hyper_*/*.py"))
    assert files
    assert [hit for f in files for hit in _module_level_weak_dicts(f)] == []
