"""Two trainers on one plugin host at the same time: each run's stages and events reach its own
per-run objects and the shared plugins, never the other run's objects."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import attrs

from hyper_core import hookimpl
from hyper_core.config import load_config_dict
from hyper_core.testing import isolated_host, read_metrics, tiny_text_config
from hyper_core.trainer.trainer import Trainer


@attrs.define(eq=True)  # unhashable, as attrs classes with eq are
class RunRecorder:
    """A per-run object: the trainers it saw, per event, and a metric it adds to its run's log."""

    tag: str
    seen: list[tuple[str, int]] = attrs.field(factory=list)

    @hookimpl
    def on_stage_end(self, stage: str, trainer: Any) -> None:
        self.seen.append((f"stage:{stage}", id(trainer)))

    @hookimpl
    def on_step_end(self, trainer: Any) -> None:
        self.seen.append(("step", id(trainer)))

    @hookimpl
    def on_log(self, trainer: Any, metrics: dict[str, Any]) -> None:
        self.seen.append(("log", id(trainer)))
        metrics[f"seen_by_{self.tag}"] = 1.0

    @hookimpl
    def on_train_end(self, trainer: Any) -> None:
        self.seen.append(("end", id(trainer)))


class RecorderPlugin:
    """A shared plugin: a new :class:`RunRecorder` per run; sees every run's steps."""

    def __init__(self) -> None:
        self.made: dict[str, RunRecorder] = {}
        self.steps: list[int] = []
        self._lock = threading.Lock()

    @hookimpl
    def build_callbacks(self, config: Any) -> RunRecorder:
        recorder = RunRecorder(Path(config.run.output_dir).name)
        with self._lock:
            self.made[recorder.tag] = recorder
        return recorder

    @hookimpl
    def on_step_end(self, trainer: Any) -> None:
        with self._lock:
            self.steps.append(id(trainer))


def trainers(tmp_path: Path, host: Any, steps: dict[str, int]) -> dict[str, Trainer]:
    out = {}
    for tag, n in steps.items():
        raw = tiny_text_config(tmp_path / tag, training={"steps": n}, logging={"every_steps": 1})
        out[tag] = Trainer(load_config_dict(raw, sections=host.registries.config_sections), host)
    return out


def check_only_own_events(
    plugin: RecorderPlugin, runs: dict[str, Trainer], steps: dict[str, int]
) -> None:
    for tag, trainer in runs.items():
        recorder = plugin.made[tag]
        assert recorder in trainer.callbacks
        assert {who for _, who in recorder.seen} == {id(trainer)}, tag
        assert [e for e, _ in recorder.seen].count("step") == steps[tag]
        assert [e for e, _ in recorder.seen].count("end") == 1
        assert not trainer.host.pm.is_registered(recorder)  # unregistered after its run
        for record in read_metrics(trainer.config.run.output_dir):
            if "loss" in record:  # its own recorder's key, never the other's
                assert {k for k in record if k.startswith("seen_by_")} == {f"seen_by_{tag}"}
    # the shared plugin saw both runs
    assert sorted(plugin.steps.count(id(t)) for t in runs.values()) == sorted(steps.values())


def test_runs_set_up_together_see_only_their_own_events(tmp_path: Path) -> None:
    plugin = RecorderPlugin()
    host = isolated_host([plugin])
    steps = {"one": 2, "two": 3}
    runs = trainers(tmp_path, host, steps)
    runs["one"].setup()
    runs["two"].setup()  # both runs' objects are registered now
    runs["one"].train()
    runs["two"].train()
    check_only_own_events(plugin, runs, steps)


def test_runs_in_threads_see_only_their_own_events(tmp_path: Path) -> None:
    plugin = RecorderPlugin()
    host = isolated_host([plugin])
    steps = {"left": 4, "right": 3}
    runs = trainers(tmp_path, host, steps)
    errors: list[BaseException] = []

    def train(trainer: Trainer) -> None:
        try:
            trainer.train()
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=train, args=(t,)) for t in runs.values()]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=600)
    assert not errors, errors
    check_only_own_events(plugin, runs, steps)
