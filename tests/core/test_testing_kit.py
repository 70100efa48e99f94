"""The pytest fixtures that plugin authors get from hyper-train (``pytest11`` entry point)."""

from __future__ import annotations

from typing import Any

from hyper_core import hookimpl


class CountSteps:
    def __init__(self) -> None:
        self.steps = 0

    @hookimpl
    def on_step_end(self) -> None:
        self.steps += 1


def test_tiny_run_fixture_trains_with_the_given_plugins(tiny_run: Any, hook_recorder: Any) -> None:
    counter = CountSteps()
    run = tiny_run(plugins=[counter, hook_recorder], steps=3)
    assert counter.steps == 3
    assert len(run.losses) == 3
    assert hook_recorder.names.count("on_step_end") == 3


def test_hyper_host_fixture_is_isolated(hyper_host: Any) -> None:
    host = hyper_host("hyper_qwen_vl.plugin")
    assert "qwen2_5_vl" in host.registries.model_adapters
    names = {r.name for r in host.records.values()}
    assert "hyper_qwen_vl.plugin" in names
    assert all(r.status != "disabled" for r in host.records.values())
    bare = hyper_host()
    assert "qwen2_5_vl" not in bare.registries.model_adapters


def test_tiny_text_config_data_needs_no_repository(tmp_path, monkeypatch) -> None:
    """The kit writes the text demo data into the cache, identical to the repository's copy."""
    from pathlib import Path

    from hyper_core.testing import tiny_text_config

    monkeypatch.setenv("HYPER_TRAIN_CACHE", str(tmp_path / "cache"))
    train = Path(tiny_text_config(tmp_path / "run")["data"]["train"])
    assert train.is_relative_to(tmp_path / "cache")
    repo = Path(__file__).resolve().parents[2] / "configs" / "data" / "text_demo.jsonl"
    assert train.read_text() == repo.read_text()
