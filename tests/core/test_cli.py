"""The command line: exit codes, one-line errors, fast paths, config show/validate."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from hyper_core.cli import main
from hyper_core.config import load_config_dict, read_toml

CORPUS = sorted((Path(__file__).parent / "bad_configs").glob("*.toml"))
REPO = Path(__file__).resolve().parents[2]


def expected_paths(path: Path) -> list[str]:
    lines = path.read_text().splitlines()
    items = [ln.removeprefix("# expect:").strip() for ln in lines if ln.startswith("# expect:")]
    return [i for i in items if i.startswith("$")] or items


@pytest.mark.parametrize("path", CORPUS, ids=[p.stem for p in CORPUS])
def test_bad_config_exits_2_with_its_path(
    path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HYPER_TRAIN_PLUGINS", "")  # only the core: plugin sections unknown
    code = main(["config", "validate", str(path)])
    err = capsys.readouterr().err
    assert code == 2, err
    assert "Traceback" not in err
    for item in expected_paths(path):
        assert item.split(" ")[0] in err, (item, err)


@pytest.mark.parametrize(
    ("override", "where"),
    [
        ("--training.lr=abc", "$.training.lr"),
        ("--training.steps=3.5", "$.training.steps"),
        ("--nosuchsection.x=1", "$.nosuchsection"),
        ("--data.batching=sorted", "$.data.batching"),
    ],
)
def test_bad_override_exits_2(
    override: str, where: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(["run", str(REPO / "configs" / "text_demo.toml"), override, "--dry-run"])
    err = capsys.readouterr().err
    assert code == 2 and where in err, err


def test_debug_shows_the_traceback(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["--debug", "config", "validate", str(CORPUS[0])])
    assert code == 2
    assert "Traceback" in capsys.readouterr().err


def test_missing_config_file_is_a_user_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["config", "validate", "/no/such/config.toml"]) == 2
    assert "/no/such/config.toml" in capsys.readouterr().err


def test_config_show_round_trips(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = REPO / "configs" / "text_demo.toml"
    assert main(["config", "show", str(src), "--training.lr=0.002"]) == 0
    shown = capsys.readouterr().out
    out = tmp_path / "shown.toml"
    out.write_text(shown)
    from hyper_core.plugins import get_plugin_host

    sections = get_plugin_host().registries.config_sections
    again = load_config_dict(read_toml(out), sections=sections)
    assert again.training.lr == 0.002
    assert again.training.warmup_steps == 20 and again.checkpoint.keep_last == 3


def test_dry_run_resolves_components(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", str(REPO / "configs" / "text_demo.toml"), "--dry-run"]) == 0
    assert "adapter hf_causal_lm" in capsys.readouterr().out


def test_filtered_out_adapter_is_not_a_pip_install(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HYPER_TRAIN_PLUGINS", "")
    cfg = tmp_path / "c.toml"
    cfg.write_text(
        '[model]\nadapter = "qwen2_5_vl"\nconfig = "tiny"\n[data]\ntrain = "t.jsonl"\n'
        "[training]\nsteps = 1\nglobal_batch_size = 1\nmicro_batch_size = 1\nlr = 1e-3\n"
    )
    assert main(["run", str(cfg), "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert "$.model.adapter" in err and "hyper-train-qwen-vl" in err
    assert "installed but disabled by HYPER_TRAIN_PLUGINS" in err and "pip install" not in err


def test_run_plugins_names_required_installed_plugins(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    text = (REPO / "configs" / "text_demo.toml").read_text()
    cfg = tmp_path / "c.toml"
    cfg.write_text(text.replace("[run]\n", '[run]\nplugins = ["hyper-train-nonexistent"]\n'))
    (tmp_path / "data").symlink_to(REPO / "configs" / "data")
    assert main(["run", str(cfg), "--dry-run"]) == 2
    assert "hyper-train-nonexistent" in capsys.readouterr().err


def _imports_after(args: list[str]) -> str:
    code = (
        "import sys; from hyper_core.cli import main\n"
        f"try:\n    main({args!r})\nexcept SystemExit:\n    pass\n"
        "print(sorted(m for m in ('torch', 'transformers') if m in sys.modules))"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        cwd=REPO,
        env={**os.environ},
        timeout=60,
    )
    return proc.stdout.strip().splitlines()[-1]


@pytest.mark.parametrize(
    "args",
    [["--help"], ["plugins"], ["config", "validate", "configs/text_demo.toml"], ["run", "--help"]],
)
def test_fast_commands_import_neither_torch_nor_transformers(args: list[str]) -> None:
    assert _imports_after(args) == "[]"


def test_a_failed_run_exits_1(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    plugin = tmp_path / "crash_plugin.py"
    plugin.write_text(
        "from hyper_core import hookimpl\n"
        "@hookimpl\n"
        "def on_train_begin():\n"
        "    raise RuntimeError('deliberate')\n"
    )
    sys.path.insert(0, str(tmp_path))
    try:
        code = main(
            [
                "run",
                str(REPO / "configs" / "text_demo.toml"),
                "--plugin",
                "crash_plugin",
                f"--run.output_dir={tmp_path / 'out'}",
                "--training.steps=1",
                "--logging.progress=none",
            ]
        )
    finally:
        sys.path.remove(str(tmp_path))
    assert code == 1
    assert "deliberate" in capsys.readouterr().err
