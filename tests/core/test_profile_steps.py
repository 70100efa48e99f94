"""``[logging] profile_steps``: torch.profiler over a window of training steps writes a trace
and an op table per rank; a bad window is one ``$.logging.profile_steps`` error."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hyper_core.cli.main import main
from hyper_core.testing import run_tiny_training, tiny_text_config

REPO = Path(__file__).resolve().parents[2]


def test_a_window_of_steps_is_profiled(tmp_path: Path) -> None:
    run_tiny_training(
        tiny_text_config(tmp_path, training={"steps": 4}, logging={"profile_steps": [2, 3]})
    )
    ops = (tmp_path / "profile" / "ops-rank0.txt").read_text()
    assert ops.startswith("steps 2-3, rank 0, torch ")
    assert "aten::mm" in ops and "Self CPU" in ops
    trace = json.loads((tmp_path / "profile" / "trace-rank0.json").read_text())
    names = {e.get("name") for e in trace["traceEvents"]}
    assert "aten::mm" in names


def test_a_run_that_ends_inside_the_window_writes_what_it_saw(tmp_path: Path) -> None:
    run_tiny_training(
        tiny_text_config(tmp_path, training={"steps": 2}, logging={"profile_steps": [2, 9]})
    )
    assert (tmp_path / "profile" / "ops-rank0.txt").read_text().startswith("steps 2-2, rank 0")


@pytest.mark.parametrize("window", ["[0, 3]", "[4, 2]", "[1, 2, 3]"])
def test_a_bad_window_names_its_path(window: str, capsys: pytest.CaptureFixture[str]) -> None:
    config = str(REPO / "configs" / "text_demo.toml")
    assert main(["config", "validate", config, f"--logging.profile_steps={window}"]) == 2
    err = capsys.readouterr().err
    assert "$.logging.profile_steps: must be [first, last] with 1 <= first <= last" in err
    assert "Traceback" not in err
