"""CUDA paths: allocator history and snapshots (mocked on CPU; real with a GPU)."""

from __future__ import annotations

import json
import pathlib
import pickle
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from mp_helpers import PROFILER_ON, read_metrics, run_in_process, write_config


class FakeCuda:
    """Stands in for the torch.cuda calls the profiler makes; records what happens."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []
        self.recording = False

    def install(self, monkeypatch: pytest.MonkeyPatch) -> None:
        mem = torch.cuda.memory
        monkeypatch.setattr(mem, "_record_memory_history", self.record_history)
        monkeypatch.setattr(mem, "_dump_snapshot", self.dump)
        for name, value in (
            ("memory_allocated", 1000),
            ("memory_reserved", 4000),
            ("max_memory_allocated", 3000),
            ("max_memory_reserved", 5000),
        ):
            monkeypatch.setattr(torch.cuda, name, lambda device=None, v=value: v)
        monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", lambda device=None: None)

    def record_history(self, enabled: Any = "all", **kwargs: Any) -> None:
        self.recording = enabled is not None
        self.calls.append(("history", enabled if enabled is None else kwargs))

    def dump(self, path: str) -> None:
        assert self.recording, "dumped after the history was stopped"
        pathlib.Path(path).write_bytes(pickle.dumps({"segments": [], "device_traces": []}))
        self.calls.append(("dump", path))


def _trainer(tmp_path: pathlib.Path, extra: str) -> Any:
    from hyper_core.config import load_config
    from hyper_core.plugins.manager import PluginHost

    cfg = write_config(tmp_path / "c.toml", tmp_path / "out", extra=extra)
    host = PluginHost()
    config = load_config(cfg, [], host.registries.config_sections)
    dist = SimpleNamespace(
        rank=0, world_size=1, device=torch.device("cuda", 0), dp_shard=1, dp_replicate=1
    )
    return SimpleNamespace(
        config=config,
        dist=dist,
        adapter=None,
        strategy=None,
        model=None,
        optimizer=None,
        train_iters=5,
    )


def test_history_spans_the_configured_steps(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from hyper_memory_profiler.profiler import RunProfiler

    fake = FakeCuda()
    fake.install(monkeypatch)
    trainer = _trainer(
        tmp_path,
        "\n[memory_profiler]\nenabled = true\nsteps = [2, 3]\n"
        "max_entries = 123\nactivations = false\ncompare_estimate = false\n",
    )
    prof = RunProfiler(
        trainer.config.section("memory_profiler"), trainer.config.run.output_dir, trainer.dist
    )
    prof.distributed_ready()
    assert prof.stages[0]["device"] == {"allocated": 1000, "reserved": 4000, "peak_allocated": 3000}
    prof.train_begin(trainer)
    for step in range(1, 6):
        prof.step_begin(trainer, step, [])
        assert fake.recording == (step in (2, 3)), step
        prof.step_end(trainer, step)
    assert fake.calls == [
        ("history", {"max_entries": 123}),
        ("dump", str(tmp_path / "out" / "memory" / "snapshot_rank0.pickle")),
        ("history", None),
    ]
    metrics: dict[str, Any] = {}
    prof.log_metrics(trainer, metrics)
    assert metrics["mem/step_peak_mib"] == 3000 / 2**20
    assert metrics["mem/step_peak_delta_mib"] == 2000 / 2**20
    assert metrics["mem/step_peak_reserved_mib"] == 5000 / 2**20
    prof.train_end(trainer)
    summary = json.loads((tmp_path / "out" / "memory" / "summary.json").read_text())
    assert summary["ranks"][0]["snapshot"].endswith("snapshot_rank0.pickle")
    assert summary["peak_method"].startswith("cuda")


def test_error_dumps_what_was_recorded(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from hyper_memory_profiler.profiler import RunProfiler

    fake = FakeCuda()
    fake.install(monkeypatch)
    trainer = _trainer(tmp_path, '\n[memory_profiler]\nenabled = true\nsteps = "1-4"\n')
    prof = RunProfiler(
        trainer.config.section("memory_profiler"), trainer.config.run.output_dir, trainer.dist
    )
    prof.train_begin(trainer)
    prof.step_begin(trainer, 1, [])
    prof.step_end(trainer, 1)
    prof.step_begin(trainer, 2, [])
    prof.train_error(trainer, RuntimeError("out of memory"))
    assert [c[0] for c in fake.calls] == ["history", "dump", "history"]
    assert not fake.recording
    snapshot = tmp_path / "out" / "memory" / "snapshot_rank0.pickle"
    assert pickle.loads(snapshot.read_bytes())["segments"] == []
    summary = json.loads((tmp_path / "out" / "memory" / "summary.json").read_text())
    assert summary["status"] == "failed" and summary["error"] == "RuntimeError: out of memory"


@pytest.mark.gpu
def test_real_cuda_run_writes_a_snapshot(tmp_path: pathlib.Path) -> None:
    cfg = write_config(tmp_path / "c.toml", tmp_path / "out", extra=PROFILER_ON)
    run_in_process(cfg)
    mem = tmp_path / "out" / "memory"
    snap = pickle.loads((mem / "snapshot_rank0.pickle").read_bytes())
    assert "segments" in snap and snap["device_traces"]
    summary = json.loads((mem / "summary.json").read_text())
    record = summary["ranks"][0]
    assert record["stages"][-1]["device"]["allocated"] > 0
    comp = summary["comparison"]
    for key in ("params", "grads", "optimizer"):
        assert comp[key]["measured"] == comp[key]["estimate"], key
    assert comp["activations"]["ratio"] == pytest.approx(1.0, abs=0.25)
    metrics = read_metrics(tmp_path / "out")
    assert all(m["mem/step_peak_reserved_mib"] > 0 for m in metrics)
