"""``metrics.jsonl``: plugins' tensor and numpy metrics become numbers; a value JSON cannot hold
is dropped with one warning naming its key and the plugin that added it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from hyper_core import hookimpl
from hyper_core.demo.text import ensure_text_demo
from hyper_core.testing import run_tiny_training, tiny_text_config
from hyper_core.trainer.metrics import MetricsWriter


class TensorMetrics:
    """Adds metrics that convert to numbers, and a set."""

    @hookimpl
    def on_log(self, metrics: dict[str, Any]) -> None:
        metrics["tensor"] = torch.tensor(2.5)
        metrics["numpy_scalar"] = np.float32(0.25)
        metrics["numpy_0d"] = np.array(3)
        metrics["labels"] = {"a", "b"}

    @hookimpl
    def on_evaluate(self, metrics: dict[str, Any]) -> None:
        metrics["eval_tensor"] = torch.tensor(True)
        metrics["eval_set"] = {1}


class VectorMetric:
    """Adds a 1-d tensor (not a number)."""

    @hookimpl
    def on_log(self, metrics: dict[str, Any]) -> None:
        metrics["vector"] = torch.ones(2)


def test_plugin_metrics_are_converted_or_dropped_with_one_warning_each(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    config = tiny_text_config(
        tmp_path,
        data={"eval": str(ensure_text_demo("eval")), "eval_samples": 8},
        training={"eval_every_steps": 1},
    )
    with caplog.at_level("WARNING", logger="hyper_train"):
        run = run_tiny_training(config, plugins=[TensorMetrics(), VectorMetric()], steps=2)
    train = [m for m in run.metrics if "loss" in m]
    assert [m["step"] for m in train] == [1, 2]
    for record in train:
        assert (record["tensor"], record["numpy_scalar"], record["numpy_0d"]) == (2.5, 0.25, 3)
        assert "labels" not in record and "vector" not in record
    assert run.eval_metrics and all(e["eval_tensor"] is True for e in run.eval_metrics)
    assert all("eval_set" not in e for e in run.eval_metrics)
    warnings = [r.getMessage() for r in caplog.records if "not logged" in r.getMessage()]
    assert sorted(warnings) == [
        "metric 'eval.eval_set' (added by plugin 'test-plugin-0-TensorMetrics') is a set, "
        "not a number or JSON value: not logged",
        "metric 'labels' (added by plugin 'test-plugin-0-TensorMetrics') is a set, "
        "not a number or JSON value: not logged",
        "metric 'vector' (added by plugin 'test-plugin-1-VectorMetric') is a Tensor of shape "
        "(2,), not a number or JSON value: not logged",
    ]


class FakeTensorBoard:
    def __init__(self) -> None:
        self.scalars: list[tuple[str, float, int]] = []

    def add_scalar(self, tag: str, value: float, step: int) -> None:
        self.scalars.append((tag, value, step))

    def close(self) -> None:
        pass


def test_tensorboard_gets_converted_numbers_and_skips_the_rest(tmp_path: Path) -> None:
    writer = MetricsWriter(tmp_path)
    tb = FakeTensorBoard()
    writer._tb = tb
    writer.write({"step": torch.tensor(3), "loss": np.float64(0.5), "odd": {1}, "vec": [1.0, 2]})
    assert tb.scalars == [("train/loss", 0.5, 3)]
    writer.close()
    assert (tmp_path / "metrics.jsonl").read_text() == (
        '{"loss": 0.5, "step": 3, "vec": [1.0, 2]}\n'
    )


def test_hfu_counts_the_recomputed_flops_beside_mfu() -> None:
    from hyper_core.parallel.env import DistEnv
    from hyper_core.trainer.metrics import StepTimer

    timer = StepTimer(peak_flops=1e12)
    timer.add_step({"tokens": 10, "padding": 0, "flops": 3e9, "hardware_flops": 4e9})
    timer.add_step({"tokens": 10, "padding": 0, "flops": 3e9, "hardware_flops": 4e9})
    out = timer.flush(DistEnv())
    assert out["hfu"] == pytest.approx(out["mfu"] * 4 / 3)
    assert out["mfu"] > 0
