"""A corrupt newest checkpoint: ``resume = "auto"`` warns and falls back to the previous one;
an explicit path is a one-line user error naming the file. Nothing is deleted for it."""

from __future__ import annotations

import logging
import os
import shutil
from pathlib import Path
from typing import Any

import pytest

from hyper_core.config import dump_config, load_config_dict
from hyper_core.errors import UserError
from hyper_core.testing import read_metrics, run_tiny_training, tiny_text_config
from hyper_core.testing.processes import hyper_train


def _config(out: Path, steps: int, **checkpoint: Any) -> dict[str, Any]:
    ckpt = {"every_steps": 2, "keep_last": None, "resume": "auto", **checkpoint}
    return tiny_text_config(out, training={"steps": steps}, checkpoint=ckpt)


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A run with complete checkpoints at steps 2 and 4 (copy it before changing it)."""
    out = tmp_path_factory.mktemp("trained") / "run"
    run_tiny_training(_config(out, 4))
    return out


def _corrupt(step_dir: Path, kind: str) -> Path:
    """Damage ``step_dir``; returns the damaged file."""
    if kind == "distcp":
        damaged = next(step_dir.glob("*.distcp"))
        os.truncate(damaged, 100)
    elif kind == "extra":
        damaged = step_dir / "extra" / "rank-0.pt"
        damaged.write_bytes(b"")
    else:
        damaged = step_dir / ".metadata"
        damaged.unlink()
    return damaged


KINDS = ["distcp", "extra", "metadata"]
PROBLEMS = {"distcp": "is truncated (100 of ", "extra": "is empty", "metadata": "is missing"}


@pytest.mark.parametrize("kind", KINDS)
def test_auto_resume_falls_back_past_a_corrupt_newest_checkpoint(
    trained: Path, tmp_path: Path, kind: str, caplog: pytest.LogCaptureFixture
) -> None:
    out = tmp_path / "run"
    shutil.copytree(trained, out)
    damaged = _corrupt(out / "checkpoints" / "step-4", kind)
    with caplog.at_level(logging.WARNING, logger="hyper_train"):
        run = run_tiny_training(_config(out, 5))
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert f"checkpoint step-4 is unreadable ({damaged} {PROBLEMS[kind]}" in "\n".join(warnings)
    assert "falling back to step-2" in warnings[0]
    assert run.trainer.state.global_step == 5
    steps = [m["step"] for m in read_metrics(out) if "loss" in m]
    assert steps == [1, 2, 3, 4, 3, 4, 5]  # steps 3 and 4 again, from step-2


@pytest.mark.parametrize("kind", KINDS)
def test_an_explicit_corrupt_checkpoint_is_a_user_error_naming_the_file(
    trained: Path, tmp_path: Path, kind: str
) -> None:
    src = tmp_path / "src"
    shutil.copytree(trained, src)
    damaged = _corrupt(src / "checkpoints" / "step-4", kind)
    raw = _config(tmp_path / "new", 5, resume=str(src / "checkpoints" / "step-4"))
    with pytest.raises(UserError) as err:
        run_tiny_training(raw)
    problem = PROBLEMS[kind]
    if kind == "distcp":  # the length .metadata expects: the intact file's
        problem += f"{(trained / 'checkpoints' / 'step-4' / damaged.name).stat().st_size} bytes)"
    assert str(err.value) == (
        f"$.checkpoint.resume: {damaged} {problem}: checkpoint step-4 is unreadable"
    )
    assert damaged.parent.exists()  # never deleted


def test_no_readable_checkpoint_is_a_user_error(trained: Path, tmp_path: Path) -> None:
    out = tmp_path / "run"
    shutil.copytree(trained, out)
    _corrupt(out / "checkpoints" / "step-4", "extra")
    _corrupt(out / "checkpoints" / "step-2", "metadata")
    with pytest.raises(UserError, match=r"no readable checkpoint in .*step-4: .*; step-2: "):
        run_tiny_training(_config(out, 5))
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["latest", "step-2", "step-4"]


def test_pruning_keeps_the_checkpoint_fallen_back_to_and_the_corrupt_one_is_replaced(
    trained: Path, tmp_path: Path
) -> None:
    out = tmp_path / "run"
    shutil.copytree(trained, out)
    ckpts = out / "checkpoints"
    _corrupt(ckpts / "step-4", "extra")
    # Resumed at step 2, saves step 3: keep_last = 1 counts only checkpoints up to step 3,
    # so the corrupt step-4 (newer) neither evicts step-3 nor is deleted.
    run_tiny_training(_config(out, 3, every_steps=1, keep_last=1))
    assert sorted(p.name for p in ckpts.iterdir()) == ["latest", "step-3", "step-4"]
    assert (ckpts / "latest").read_text() == "step-3"
    # The next run resumes from `latest` (step-3); its save of step 4 replaces the corrupt one.
    run = run_tiny_training(_config(out, 4, every_steps=1, keep_last=1))
    assert run.trainer.checkpointer.resume_path() == ckpts / "step-3"
    assert sorted(p.name for p in ckpts.iterdir()) == ["latest", "step-4"]
    assert (ckpts / "step-4" / "extra" / "rank-0.pt").stat().st_size > 0


def test_a_load_that_fails_falls_back_too(
    trained: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import torch.distributed.checkpoint as dcp

    out = tmp_path / "run"
    shutil.copytree(trained, out)
    real_load = dcp.load

    def load(state: Any, *, checkpoint_id: str, **kwargs: Any) -> None:
        if checkpoint_id.endswith("step-4"):
            raise EOFError("Ran out of input")
        real_load(state, checkpoint_id=checkpoint_id, **kwargs)

    monkeypatch.setattr(dcp, "load", load)
    run = run_tiny_training(_config(out, 5))
    assert run.trainer.checkpointer.resume_path() == out / "checkpoints" / "step-2"
    assert [m["step"] for m in read_metrics(out) if "loss" in m][-3:] == [3, 4, 5]


def test_cli_explicit_corrupt_checkpoint_exits_2_in_one_line(trained: Path, tmp_path: Path) -> None:
    src = tmp_path / "src"
    shutil.copytree(trained, src)
    damaged = _corrupt(src / "checkpoints" / "step-4", "extra")
    config = tmp_path / "run.toml"
    raw = _config(tmp_path / "new", 5, resume=str(src / "checkpoints" / "step-4"))
    config.write_text(dump_config(load_config_dict(raw)))
    proc = hyper_train(["run", str(config)], timeout=120)
    assert proc.returncode == 2, proc.stderr[-3000:]
    errors = [line for line in proc.stderr.splitlines() if line.startswith("hyper-train: error:")]
    assert errors == [
        f"hyper-train: error: $.checkpoint.resume: {damaged} is empty: "
        "checkpoint step-4 is unreadable"
    ]
    assert "Traceback" not in proc.stderr
