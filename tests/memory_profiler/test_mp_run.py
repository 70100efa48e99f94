"""A tiny profiled run end to end: outputs, exact accounting, metrics, estimate, failures."""

from __future__ import annotations

import json
import pathlib
import sys
from typing import Any

import pytest
from mp_helpers import PROFILER_ON, VL, read_metrics, run_in_process, write_config

from hyper_core import hookimpl
from hyper_core.hookspecs import BUILD_STAGES


def _direct_bytes(tensors: Any) -> int:
    """Bytes of tensors, each storage-owning tensor once, counted without the plugin's code."""
    seen: dict[int, int] = {}
    for t in tensors:
        local = t.to_local() if hasattr(t, "to_local") else t
        seen[id(t)] = local.numel() * local.element_size()
    return sum(seen.values())


class DirectCount:
    """A test plugin that counts the model's and optimizer's tensors at the same moments."""

    def __init__(self) -> None:
        self.stages: dict[str, dict[str, int]] = {}
        self.after_backward: dict[str, int] = {}
        self.after_step: dict[str, int] = {}

    @staticmethod
    def _count(model: Any, optimizer: Any) -> dict[str, int]:
        params = list(model.parameters()) if model is not None else []
        opt = []
        if optimizer is not None:
            opt = [v for st in optimizer.state.values() for v in st.values() if hasattr(v, "numel")]
        return {
            "params": _direct_bytes(params),
            "grads": _direct_bytes([p.grad for p in params if p.grad is not None]),
            "optimizer": _direct_bytes(opt),
        }

    @hookimpl
    def on_stage_end(self, stage: str, result: Any, trainer: Any) -> None:
        model = result if stage in ("build_model", "parallelize_model") else trainer.model
        optimizer = result if stage == "build_optimizer" else trainer.optimizer
        self.stages[stage] = self._count(model, optimizer)

    @hookimpl
    def on_micro_step_end(self, trainer: Any, state: Any) -> None:
        if state.global_step == 0:
            self.after_backward = self._count(trainer.model, trainer.optimizer)

    @hookimpl
    def on_step_end(self, trainer: Any, state: Any) -> None:
        if state.global_step == 1:
            self.after_step = self._count(trainer.model, trainer.optimizer)


@pytest.fixture(scope="module")
def profiled(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """One enabled run (3 steps, steps 1-2 recorded) and the same run disabled."""
    root = tmp_path_factory.mktemp("profiled")
    on = write_config(root / "on.toml", root / "on", extra=PROFILER_ON)
    off = write_config(root / "off.toml", root / "off")
    direct = DirectCount()
    trainer = run_in_process(on, plugins=[("direct-count", direct)])
    run_in_process(off)
    summary = json.loads((root / "on" / "memory" / "summary.json").read_text())
    return {
        "root": root,
        "config": on,
        "out": root / "on",
        "off": root / "off",
        "summary": summary,
        "direct": direct,
        "trainer": trainer,
    }


def test_all_outputs_written(profiled: dict[str, Any]) -> None:
    mem = profiled["out"] / "memory"
    assert (mem / "summary.json").is_file()
    assert (mem / "memory.png").stat().st_size > 10_000
    report = (mem / "report.md").read_text()
    assert "## Per stage (rank 0)" in report
    assert "| build_optimizer |" in report
    assert "## Estimate vs measured (rank 0)" in report
    summary = profiled["summary"]
    assert summary["status"] == "completed"
    assert summary["plot"] == "memory.png"
    assert summary["ranks"][0]["errors"] == []
    assert not list(mem.glob("*.pickle"))  # CPU: no allocator snapshot


def test_stage_rows_equal_a_direct_count(profiled: dict[str, Any]) -> None:
    record = profiled["summary"]["ranks"][0]
    direct: DirectCount = profiled["direct"]
    rows = {s["stage"]: s for s in record["stages"]}
    assert [s["stage"] for s in record["stages"]][: len(BUILD_STAGES)] == list(BUILD_STAGES)
    for stage in BUILD_STAGES:
        for cat in ("params", "grads", "optimizer"):
            assert rows[stage][cat]["total"] == direct.stages[stage][cat], (stage, cat)
    assert rows["setup_distributed"]["params"]["total"] == 0
    assert rows["build_model"]["params"]["total"] > 0
    bwd = rows["step 1: after backward"]
    opt = rows["step 1: after optimizer step"]
    assert bwd["grads"]["total"] == direct.after_backward["grads"] > 0
    assert opt["optimizer"]["total"] == direct.after_step["optimizer"] > 0
    assert opt["params"]["total"] == direct.after_step["params"]
    # AdamW: exp_avg + exp_avg_sq like the fp32 parameters, plus a 4-byte step per tensor.
    n_tensors = opt["params"]["count"]
    assert opt["optimizer"]["total"] == 2 * opt["params"]["total"] + 4 * n_tensors
    for row in record["stages"]:
        for cat in ("params", "grads", "optimizer", "buffers"):
            assert sum(row[cat]["by_group"].values()) == row[cat]["total"]
            assert sum(row[cat]["by_dtype"].values()) == row[cat]["total"]
    assert row["device"]["rss"] > 0


@pytest.mark.skipif(not VL, reason="needs hyper-train-qwen-vl")
def test_groups_follow_the_adapter(profiled: dict[str, Any]) -> None:
    trainer = profiled["trainer"]
    record = profiled["summary"]["ranks"][0]
    by_group = record["stages"][-1]["params"]["by_group"]
    assert set(by_group) == {"vision", "projector", "language"}
    model = trainer.unwrapped_model
    for group, paths in trainer.adapter.freeze_groups(model).items():
        expected = _direct_bytes(
            {id(p): p for path in paths for p in model.get_submodule(path).parameters()}.values()
        )
        assert by_group[group] == expected, group


def test_steps_and_metrics(profiled: dict[str, Any]) -> None:
    record = profiled["summary"]["ranks"][0]
    assert [s["step"] for s in record["steps"]] == [1, 2]
    assert [p[0] for p in record["step_peaks"]] == [1, 2, 3]
    for s in record["steps"]:
        assert s["peak"] >= s["start"] > 0
        assert s["activations"] > 0
    metrics = read_metrics(profiled["out"])
    assert [m["step"] for m in metrics] == [1, 2, 3]
    for m in metrics:
        assert m["mem/step_peak_mib"] > 50  # a process RSS, in MiB
        assert m["mem/peak_mib"] >= m["mem/step_peak_mib"]
    assert "mem/activations_mib" in metrics[0] and "mem/activations_mib" in metrics[1]
    assert "mem/activations_mib" not in metrics[2]  # step 3 is not recorded
    assert metrics[0]["mem/activations_mib"] == pytest.approx(
        record["steps"][0]["activations"] / 2**20
    )


def test_losses_identical_enabled_and_disabled(profiled: dict[str, Any]) -> None:
    on = [m["loss"] for m in read_metrics(profiled["out"])]
    off = [m["loss"] for m in read_metrics(profiled["off"])]
    assert len(on) == 3
    assert on == off
    assert not (profiled["off"] / "memory").exists()


def test_in_run_estimate_matches_measurement(profiled: dict[str, Any]) -> None:
    comp = profiled["summary"]["comparison"]
    for key in ("params", "grads", "optimizer", "buffers"):
        assert comp[key]["measured"] == comp[key]["estimate"], key
    assert comp["activations"]["ratio"] == pytest.approx(1.0, abs=0.25)


def _cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    from hyper_core.cli import main

    capsys.readouterr()
    code = main(list(argv))
    return code, capsys.readouterr().out


def test_estimate_cli_matches_the_cpu_run(
    profiled: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    """`memory estimate` (meta device) = the run's measured state exactly; activations for
    the measured micro-batch within 25 %."""
    from hyper_memory_profiler.report import first_measured_step, measured_state

    record = profiled["summary"]["ranks"][0]
    batch = first_measured_step(record)["batch"]
    code, out = _cli(
        capsys,
        "memory",
        "estimate",
        str(profiled["config"]),
        "--json",
        "--tokens",
        str(batch["rows"] * batch["seq_len"]),
        "--samples",
        str(batch["samples"]),
        "--patches",
        str(batch["patches"]),
    )
    assert code == 0
    est = json.loads(out)
    measured = measured_state(record)
    for key in ("params", "grads", "optimizer", "buffers"):
        assert est["per_rank"][key] == measured[key]["total"], key
        nonzero = {g: v for g, v in measured[key]["by_group"].items() if v}
        assert {g: v for g, v in est["state"][key]["by_group"].items() if v} == nonzero, key
    acts = first_measured_step(record)["activations"]
    assert est["per_rank"]["activations"] == pytest.approx(acts, rel=0.25)


def test_estimate_cli_table_and_fit(
    profiled: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    code, out = _cli(
        capsys, "memory", "estimate", str(profiled["config"]), "--device-memory", "1GiB"
    )
    assert code == 0
    assert "parameters" in out and "optimizer state" in out
    assert ": fits (" in out
    code, out = _cli(
        capsys, "memory", "estimate", str(profiled["config"]), "--device-memory", "1MiB"
    )
    assert "does NOT fit" in out
    # overrides apply like `run`'s: a frozen vision tower has no gradients or optimizer state
    if VL:
        code, out = _cli(
            capsys,
            "memory",
            "estimate",
            str(profiled["config"]),
            "--json",
            '--model.freeze=["vision", "projector"]',
        )
        est = json.loads(out)
        assert "vision" not in est["state"]["grads"]["by_group"]
        assert est["state"]["params"]["by_group"]["vision"] > 0


def test_report_cli(profiled: dict[str, Any], capsys: pytest.CaptureFixture[str]) -> None:
    code, out = _cli(capsys, "memory", "report", str(profiled["out"]))
    assert code == 0
    assert out == (profiled["out"] / "memory" / "report.md").read_text()
    code, out = _cli(capsys, "memory", "report", str(profiled["out"] / "memory"), "--json")
    assert json.loads(out)["status"] == "completed"
    assert _cli(capsys, "memory", "report", str(profiled["off"]))[0] == 2


class FailAtStep2:
    """Raises inside step 2."""

    @hookimpl
    def on_step_begin(self, state: Any) -> None:
        if state.global_step == 1:
            raise RuntimeError("boom in step 2")


def test_error_in_step_2_leaves_the_summary(tmp_path: pathlib.Path) -> None:
    cfg = write_config(tmp_path / "c.toml", tmp_path / "out", extra=PROFILER_ON)
    with pytest.raises(RuntimeError, match="boom in step 2"):
        run_in_process(cfg, plugins=[("fail-at-step-2", FailAtStep2())])
    summary = json.loads((tmp_path / "out" / "memory" / "summary.json").read_text())
    assert summary["status"] == "failed"
    assert summary["error"] == "RuntimeError: boom in step 2"
    record = summary["ranks"][0]
    assert [s["step"] for s in record["steps"]] == [1]
    assert record["stages"][-1]["stage"] == "step 1: after optimizer step"
    assert "failed" in (tmp_path / "out" / "memory" / "report.md").read_text()


def test_without_matplotlib(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("matplotlib", "matplotlib.pyplot", "matplotlib.ticker"):
        monkeypatch.setitem(sys.modules, name, None)  # `import matplotlib` raises ImportError
    cfg = write_config(tmp_path / "c.toml", tmp_path / "out", extra=PROFILER_ON)
    run_in_process(cfg, ["--training.steps=1"])
    mem = tmp_path / "out" / "memory"
    summary = json.loads((mem / "summary.json").read_text())
    assert summary["status"] == "completed"
    assert summary["plot"] is None
    assert (mem / "report.md").is_file()
    assert not (mem / "memory.png").exists()


def test_absolute_output_dir_and_all_steps(tmp_path: pathlib.Path) -> None:
    where = tmp_path / "elsewhere"
    extra = (
        f'\n[memory_profiler]\nenabled = true\nsteps = "all"\noutput_dir = "{where}"\n'
        "activations = false\n"
    )
    cfg = write_config(tmp_path / "c.toml", tmp_path / "out", extra=extra)
    run_in_process(cfg, ["--training.steps=2"])
    summary = json.loads((where / "summary.json").read_text())
    steps = summary["ranks"][0]["steps"]
    assert [s["step"] for s in steps] == [1, 2]
    assert all("activations" not in s for s in steps)
    assert not (tmp_path / "out" / "memory").exists()


def test_two_trainers_in_one_process_have_their_own_profiler(tmp_path: pathlib.Path) -> None:
    """Each run owns its MemoryProfilerRun: nothing recorded by one run reaches the other,
    and neither stays registered on the shared plugin host after its run."""
    from hyper_core.config import load_config
    from hyper_core.plugins.manager import PluginHost
    from hyper_core.trainer.trainer import Trainer
    from hyper_memory_profiler.plugin import MemoryProfilerRun

    extra = '\n[memory_profiler]\nenabled = true\nsteps = "all"\nactivations = false\n'
    host = PluginHost()
    trainers = []
    for name, steps in (("a", 2), ("b", 3)):
        cfg = write_config(tmp_path / f"{name}.toml", tmp_path / name, extra=extra)
        config = load_config(cfg, [f"--training.steps={steps}"], host.registries.config_sections)
        trainer = Trainer(config, host)
        trainer.train()
        trainers.append(trainer)
    runs = [next(cb for cb in t.callbacks if isinstance(cb, MemoryProfilerRun)) for t in trainers]
    assert runs[0] is not runs[1] and runs[0].profiler is not runs[1].profiler
    assert not any(host.pm.is_registered(run) for run in runs)
    for name, steps in (("a", [1, 2]), ("b", [1, 2, 3])):
        record = json.loads((tmp_path / name / "memory" / "summary.json").read_text())
        assert [s["step"] for s in record["ranks"][0]["steps"]] == steps, name
        stages = [s["stage"] for s in record["ranks"][0]["stages"]]
        assert stages.count("setup_distributed") == 1, name
