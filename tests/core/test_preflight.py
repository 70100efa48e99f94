"""``config validate`` and ``run --dry-run`` check the config against this machine: missing data
files and image directories by their ``$.path`` with a did-you-mean, and loggers not installed.
``memory estimate``-style callers of ``load_run_config`` are not held to it."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from hyper_core.cli import main

REPO = Path(__file__).resolve().parents[2]
CONFIG = REPO / "configs" / "text_demo.toml"
DATA = REPO / "configs" / "data"


def errors(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, list[str]]:
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.err.splitlines()


@pytest.mark.parametrize("command", [["config", "validate"], ["run", "--dry-run"]])
def test_a_data_file_typo_names_its_path_and_the_near_miss(
    command: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    code, err = errors(capsys, *command, str(CONFIG), "--data.train=data/text_dmeo.jsonl")
    assert code == 2
    assert err == [
        f"hyper-train: error: {CONFIG}: $.data.train: data file not found: "
        f"{DATA}/text_dmeo.jsonl; did you mean 'text_demo.jsonl'?"
    ]


def test_every_missing_path_is_reported_at_once(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "images").mkdir()
    second = f'{{ path = "{tmp_path}/b.jsonl", image_dir = "{tmp_path}/imgs" }}'
    train = f'[ "{DATA}/text_demo.jsonl", {second} ]'
    code, err = errors(
        capsys,
        "config",
        "validate",
        str(CONFIG),
        f"--data.train={train}",
        f"--data.eval={tmp_path}/nowhere/e.jsonl",
        f"--data.image_root={tmp_path}/image",
    )
    assert code == 2
    assert err == [
        f"hyper-train: error: {CONFIG}: 4 problems",
        f"  $.data.image_root: image directory not found: {tmp_path}/image; did you mean 'images'?",
        f"  $.data.train[1].image_dir: image directory not found: {tmp_path}/imgs; "
        "did you mean 'images'?",
        f"  $.data.train[1].path: data file not found: {tmp_path}/b.jsonl",
        f"  $.data.eval: directory not found: {tmp_path}/nowhere",
    ]


def test_present_data_passes(capsys: pytest.CaptureFixture[str]) -> None:
    code, err = errors(capsys, "config", "validate", str(CONFIG), f"--data.image_root={DATA}")
    assert code == 0, err


@pytest.mark.parametrize("installed", [False, True])
def test_a_logger_must_be_installed(
    installed: bool, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    real = importlib.util.find_spec

    def find_spec(name: str, *args: object) -> object:
        if name == "tensorboard":
            return object() if installed else None
        return real(name, *args)

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)
    code, err = errors(capsys, "config", "validate", str(CONFIG), "--logging.tensorboard=true")
    if installed:
        assert code == 0, err
        return
    assert code == 2
    assert err == [
        f"hyper-train: error: {CONFIG}: $.logging.tensorboard: tensorboard is not installed; "
        "pip install 'hyper-train[tensorboard]'"
    ]
