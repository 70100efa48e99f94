"""The pytest fixtures that plugin authors get from hyper-train (``pytest11`` entry point)."""

from __future__ import annotations

import os
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


def test_pytest_plugin_registers_the_slow_marker_for_strict_markers(tmp_path) -> None:
    """A third-party package (own ini, no ``slow`` marker) runs slow-marked tests strictly."""
    import subprocess
    import sys

    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    (tmp_path / "test_third_party.py").write_text(
        "import pytest\n\n\n@pytest.mark.slow\ndef test_marked():\n    pass\n"
    )
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "--strict-markers", "-p", "no:cacheprovider"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "1 passed" in proc.stdout


def test_subprocess_env_is_a_clean_rank_environment(tmp_path, monkeypatch) -> None:
    from hyper_core.testing.processes import hyper_train, subprocess_env

    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    monkeypatch.setenv("MASTER_PORT", "1234")
    env = subprocess_env([tmp_path], HT_X="1")
    assert not {"RANK", "LOCAL_WORLD_SIZE", "MASTER_PORT"} & set(env)
    assert env["PYTHONPATH"].split(os.pathsep)[0] == str(tmp_path)
    assert env["OMP_NUM_THREADS"] == "1" and env["HT_X"] == "1"
    (tmp_path / "probe_plugin.py").write_text(
        "from hyper_core import hookimpl\n\n\n@hookimpl\n"
        "def register_dataset_formats(register):\n"
        "    register('probe_format', 'probe_plugin:load')\n"
    )
    proc = hyper_train(["plugins", "--plugin", "probe_plugin"], importable=[tmp_path])
    assert proc.returncode == 0, proc.stderr
    assert "probe_format" in proc.stdout
