"""``hyper-train new-plugin``: the scaffold's files, its errors, and (slow) that a scaffolded
package installs into a fresh environment, is found there and passes its own tests."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from hyper_core.cli import main
from hyper_core.config import read_toml
from hyper_core.scaffold import FILES, KINDS, render

REPO = Path(__file__).resolve().parents[2]
NAME = "demo-thing"
RUFF = shutil.which("ruff", path=str(Path(sys.executable).parent)) or shutil.which("ruff")

EXPECTED = {
    "plugin": {
        "pyproject.toml",
        "README.md",
        "hyper_demo_thing/__init__.py",
        "hyper_demo_thing/plugin.py",
        "tests/test_demo_thing.py",
    },
    "adapter": {
        "pyproject.toml",
        "README.md",
        "hyper_demo_thing/__init__.py",
        "hyper_demo_thing/plugin.py",
        "hyper_demo_thing/adapter.py",
        "tests/test_demo_thing.py",
    },
}


def _files(root: Path) -> set[str]:
    return {p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file()}


def _scaffold(tmp_path: Path, kind: str, name: str = NAME) -> Path:
    assert main(["new-plugin", name, "--kind", kind, "--out", str(tmp_path)]) == 0
    return tmp_path / f"hyper-train-{name}"


# -- fast ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
def test_writes_the_expected_files(
    kind: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = _scaffold(tmp_path, kind)
    assert _files(root) == EXPECTED[kind]
    assert "pip install -e" in capsys.readouterr().out
    project = read_toml(root / "pyproject.toml")
    assert project["build-system"]["build-backend"] == "setuptools.build_meta"
    assert project["project"]["name"] == "hyper-train-demo-thing"
    assert project["project"]["dependencies"] == ["hyper-train"]
    assert any(d.startswith("pytest") for d in project["project"]["optional-dependencies"]["test"])
    entry_points = project["project"]["entry-points"]["hyper_train.plugins"]
    assert entry_points == {NAME: "hyper_demo_thing.plugin"}
    assert project["tool"]["setuptools"]["packages"]["find"]["include"] == ["hyper_demo_thing*"]
    readme = (root / "README.md").read_text()
    assert "pip install" in readme and "pytest" in readme and "```toml" in readme
    tests = (root / "tests/test_demo_thing.py").read_text()
    if kind == "adapter":
        assert 'check_adapter(ADAPTER, "tiny", plugins=[PLUGIN]' in tests
        assert (
            "class DemoThingAdapter(HFCausalLMAdapter)"
            in (root / "hyper_demo_thing/adapter.py").read_text()
        )
    else:
        assert "tiny_run(plugins=[PLUGIN, hook_recorder]" in tests
        plugin = (root / "hyper_demo_thing/plugin.py").read_text()
        assert "def register_config_sections" in plugin
        # It teaches per-run state on the run's own object, none at module level.
        assert "def build_callbacks(config: Any) -> DemoThingRun | None:" in plugin
        assert "Weak" not in plugin and "_RUNS" not in plugin


def test_the_default_kind_is_plugin_and_the_default_dir_is_cwd(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    assert main(["new-plugin", "x1"]) == 0
    assert _files(tmp_path / "hyper-train-x1") == {
        f.replace("demo_thing", "x1") for f in EXPECTED["plugin"]
    }


@pytest.mark.parametrize(
    "name",
    ["My-Plugin", "1abc", "a_b", "a--b", "-ab", "ab-", "a b", "hyper-train-x", "core", "x" * 31],
)
def test_a_bad_name_exits_2(name: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["new-plugin", "--out", str(tmp_path), "--", name]) == 2
    err = capsys.readouterr().err
    assert "new-plugin:" in err and "NAME" in err and "Traceback" not in err, err
    assert not any(tmp_path.iterdir())


def test_a_name_that_clashes_with_a_core_section_exits_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["new-plugin", "training", "--out", str(tmp_path)]) == 2
    assert "[training]" in capsys.readouterr().err
    assert main(["new-plugin", "training", "--kind", "adapter", "--out", str(tmp_path)]) == 0


def test_an_existing_folder_is_not_overwritten(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    target = tmp_path / f"hyper-train-{NAME}"
    target.mkdir()
    (target / "mine.txt").write_text("keep me")
    assert main(["new-plugin", NAME, "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "already exists" in err and str(target) in err and "Traceback" not in err
    assert _files(target) == {"mine.txt"}
    assert (target / "mine.txt").read_text() == "keep me"


def test_an_existing_empty_folder_is_filled(tmp_path: Path) -> None:
    (tmp_path / f"hyper-train-{NAME}").mkdir()
    assert _files(_scaffold(tmp_path, "plugin")) == EXPECTED["plugin"]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("name", [NAME, "a-rather-long-plugin-name-xyzw"])
def test_the_generated_python_compiles_and_passes_ruff(
    kind: str, name: str, tmp_path: Path
) -> None:
    assert_generated_code_is_clean(_scaffold(tmp_path, kind, name))


def assert_generated_code_is_clean(root: Path) -> None:
    """Every ``.py`` under ``root`` compiles and passes ``ruff check`` and ``ruff format``."""
    for path in root.rglob("*.py"):
        compile(path.read_text(), str(path), "exec")
    if RUFF is None:
        pytest.skip("ruff is not installed")
    for cmd in (["check"], ["format", "--check", "--diff"]):
        proc = subprocess.run(
            [RUFF, *cmd, "--no-cache", "."], cwd=root, capture_output=True, text=True, check=False
        )
        assert proc.returncode == 0, proc.stdout + proc.stderr


def test_every_template_is_used_and_rendered_completely() -> None:
    templates = Path(__file__).resolve().parents[2] / "hyper_core" / "scaffold" / "templates"
    used = {src for files in FILES.values() for _, src in files}
    assert used == {p.relative_to(templates).as_posix() for p in templates.rglob("*.tmpl")}
    for kind in KINDS:
        for rel, text in render(NAME, kind).items():
            assert "${" not in text and "$$" not in text, rel


def test_the_templates_are_package_data() -> None:
    package_data = read_toml(REPO / "pyproject.toml")["tool"]["setuptools"]["package-data"]
    assert "scaffold/templates/**/*.tmpl" in package_data["hyper_core"]


def test_new_plugin_imports_neither_torch_nor_transformers(tmp_path: Path) -> None:
    code = (
        "import sys; from hyper_core.cli import main\n"
        f"assert main(['new-plugin', 'x', '--kind', 'adapter', '--out', {str(tmp_path)!r}]) == 0\n"
        "print(sorted(m for m in ('torch', 'transformers') if m in sys.modules))"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=60
    )
    assert proc.stdout.strip().splitlines()[-1] == "[]", proc.stderr


# -- slow: a fresh environment ------------------------------------------------------------------


def _fresh_env(root: Path) -> Path:
    """A venv layered on this one: its site-packages (editable installs included, which is why
    the ``.pth`` calls ``site.addsitedir`` rather than naming the path) come after its own, so
    torch is not reinstalled. pip, too, is this environment's."""
    fresh = root / "fresh"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(fresh)], check=True)
    python = fresh / "bin" / "python"
    purelib = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    parent = sysconfig.get_paths()["purelib"]
    (Path(purelib) / "_hyper_train_parent.pth").write_text(
        f"import site; site.addsitedir({parent!r})\n"
    )
    return python


def _run(cmd: list[str], cwd: Path, timeout: int = 300) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "HYPER_TRAIN_PLUGINS")}
    return subprocess.run(
        [str(c) for c in cmd],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def _plugin_names(python: str | Path, cwd: Path) -> dict[str, str]:
    proc = _run([python, "-m", "hyper_core", "plugins", "--json"], cwd)
    assert proc.returncode == 0, proc.stderr
    return {r["name"]: r["status"] for r in json.loads(proc.stdout)}


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize("kind", KINDS)
def test_a_scaffold_installs_is_found_and_passes_its_tests(kind: str, tmp_path: Path) -> None:
    name = f"fresh-{kind}"
    package = f"hyper_fresh_{kind}"
    root = _scaffold(tmp_path, kind, name)
    python = _fresh_env(tmp_path)
    probe = _run([python, "-c", "import setuptools, pip, hyper_core, torch"], tmp_path)
    assert probe.returncode == 0, f"the fresh venv does not see the parent's:\n{probe.stderr}"

    pip = [python, "-m", "pip", "install", "--no-deps", "--no-build-isolation", "--no-index"]
    proc = _run([*pip, "--quiet", root], tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    where = _run([python, "-c", f"import {package}; print({package}.__file__)"], tmp_path)
    assert where.returncode == 0, where.stderr
    assert Path(where.stdout.strip()).is_relative_to(tmp_path / "fresh"), where.stdout

    assert _plugin_names(python, tmp_path).get(name) == "loaded"
    assert name not in _plugin_names(sys.executable, tmp_path)  # this env is untouched

    tests = _run([python, "-m", "pytest", root / "tests", "-q", "-p", "no:cacheprovider"], tmp_path)
    assert tests.returncode == 0, tests.stdout[-4000:] + tests.stderr[-2000:]
    passed = 5 if kind == "plugin" else 4
    assert f"{passed} passed" in tests.stdout, tests.stdout[-2000:]
    if kind == "adapter":  # --vision, in the same environment: it passes conformance there too
        vl_args = ["--kind", "adapter", "--vision", "--out", str(tmp_path / "vl")]
        assert main(["new-plugin", "fresh-vl", *vl_args]) == 0
        vl_root = tmp_path / "vl" / "hyper-train-fresh-vl"
        proc = _run([*pip, "--quiet", vl_root], tmp_path)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert _plugin_names(python, tmp_path).get("fresh-vl") == "loaded"
        tests = _run(
            [python, "-m", "pytest", vl_root / "tests", "-q", "-p", "no:cacheprovider"], tmp_path
        )
        assert tests.returncode == 0, tests.stdout[-4000:] + tests.stderr[-2000:]
        assert "3 passed" in tests.stdout, tests.stdout[-2000:]
        # --vision --tiles: a tile-based adapter on the core's vision defaults passes too
        tiles_args = ["--kind", "adapter", "--vision", "--tiles", "--out", str(tmp_path / "t")]
        assert main(["new-plugin", "fresh-tiles", *tiles_args]) == 0
        tiles_root = tmp_path / "t" / "hyper-train-fresh-tiles"
        proc = _run([*pip, "--quiet", tiles_root], tmp_path)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert _plugin_names(python, tmp_path).get("fresh-tiles") == "loaded"
        tests = _run(
            [python, "-m", "pytest", tiles_root / "tests", "-q", "-p", "no:cacheprovider"], tmp_path
        )
        assert tests.returncode == 0, tests.stdout[-4000:] + tests.stderr[-2000:]
        assert "3 passed" in tests.stdout, tests.stdout[-2000:]
