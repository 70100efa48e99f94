"""The run's last lines say how it ended: done, or interrupted with the checkpoint to resume
from; eval figures of an earlier step are dated."""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

import pytest

from hyper_core.config import load_config_dict
from hyper_core.demo.text import ensure_text_demo
from hyper_core.hookspecs import hookimpl
from hyper_core.testing import isolated_host, tiny_text_config
from hyper_core.trainer.run import run_training


class SigtermAtStep:
    def __init__(self, step: int) -> None:
        self.step = step

    @hookimpl
    def on_step_end(self, state: Any) -> None:
        if state.global_step == self.step:
            os.kill(os.getpid(), signal.SIGTERM)


def test_an_interrupted_run_says_where_it_stopped_and_dates_its_eval(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    raw = tiny_text_config(
        tmp_path,
        data={"eval": str(ensure_text_demo("eval")), "eval_samples": 8},
        training={"steps": 10, "eval_every_steps": 1},
        checkpoint={"resume": "auto"},
    )
    run_training(load_config_dict(raw), isolated_host([SigtermAtStep(2)]))
    lines = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("hyper-train: ")]
    ckpt = tmp_path / "checkpoints" / "step-2"
    assert (ckpt / "COMPLETE").is_file()
    assert lines[-2] == (
        f"hyper-train: interrupted at step 2/10; checkpoint saved ({ckpt}); "
        f"run the same command to resume; outputs in {tmp_path}"
    )
    assert lines[-1].startswith("hyper-train: held-out answer accuracy at step 1: all ")
    assert not any("done:" in ln for ln in lines)


def test_a_finished_run_says_done_with_its_final_eval(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    raw = tiny_text_config(
        tmp_path,
        data={"eval": str(ensure_text_demo("eval")), "eval_samples": 8},
        training={"steps": 2},
    )
    run_training(load_config_dict(raw), isolated_host())
    lines = capsys.readouterr().err.splitlines()[-2:]
    assert lines[0] == f"hyper-train: done: 2 steps; outputs in {tmp_path}"
    assert lines[1].startswith("hyper-train: held-out answer accuracy: all ")
