"""``[checkpoint] save_final = false`` skips the end-of-training save (benchmarks), never the
save of a run stopped by a signal."""

from __future__ import annotations

from pathlib import Path

from hyper_core.testing import run_tiny_training, tiny_text_config


def _steps(out: Path) -> list[str]:
    return sorted(p.name for p in (out / "checkpoints").glob("step-*"))


def test_no_final_save_when_asked(tmp_path: Path) -> None:
    run_tiny_training(tiny_text_config(tmp_path / "a", checkpoint={"save_final": False}), steps=3)
    run_tiny_training(tiny_text_config(tmp_path / "b"), steps=3)
    assert not (tmp_path / "a" / "checkpoints").exists() or _steps(tmp_path / "a") == []
    assert _steps(tmp_path / "b") == ["step-3"]


def test_every_steps_still_saves(tmp_path: Path) -> None:
    cfg = tiny_text_config(tmp_path, checkpoint={"save_final": False, "every_steps": 2})
    run_tiny_training(cfg, steps=3)
    assert _steps(tmp_path) == ["step-2"]
