"""``hyper-train config validate`` checks ``[model.options]`` against the adapter's options."""

from __future__ import annotations

from pathlib import Path

import pytest

from hyper_core.cli import main

REPO = Path(__file__).resolve().parents[2]
DEMO = "configs/qwen2_5_vl_demo.toml"


def test_an_unknown_model_option_exits_2_naming_its_path(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(REPO)
    code = main(["config", "validate", DEMO, "--model.options.tile_size=512"])
    err = capsys.readouterr().err
    assert code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("hyper-train: error: "), err
    assert "$.model.options.tile_size" in lines[0], err


def test_a_known_model_option_validates(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(REPO)
    code = main(["config", "validate", DEMO, "--model.options.max_image_tokens=64"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    assert captured.out.strip() == f"{DEMO}: ok"
