"""Plugin discovery through real entry points, failures, filters and conflicts."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from hyper_core.errors import PluginError
from hyper_core.plugins.manager import PluginHost
from hyper_core.registry import Registry, normalize_name


def make_dist(root: Path, dist: str, version: str, module: str, source: str, ep_name: str) -> None:
    """A fake installed distribution: a module plus its ``*.dist-info`` with an entry point."""
    (root / f"{module}.py").write_text(textwrap.dedent(source))
    info = root / f"{dist.replace('-', '_')}-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n")
    (info / "entry_points.txt").write_text(f"[hyper_train.plugins]\n{ep_name} = {module}\n")


GOOD = """
from hyper_core import hookimpl

@hookimpl
def register_model_adapters(register):
    register("my_adapter", "good_mod:Adapter", aliases=["MyModelForCausalLM"])

@hookimpl
def on_train_begin(trainer, state):
    pass

@hookimpl
def register_commands(register):
    def add_arguments(parser):
        parser.add_argument("word")
    def run(args):
        print("echo:", args.word)
        return 3
    register("echo", add_arguments, run, help="say a word")
"""
BROKEN = "raise RuntimeError('boom at import')\n"
MISSPELLED = """
from hyper_core import hookimpl

@hookimpl
def build_modle(config):
    return None
"""
CLASH = """
from hyper_core import hookimpl

@hookimpl
def register_model_adapters(register):
    register("my-adapter", "clash_mod:Other")
"""


def run_cli(args: list[str], pythonpath: Path, **env: str) -> subprocess.CompletedProcess[str]:
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("HYPER_TRAIN_")}
    full_env["PYTHONPATH"] = str(pythonpath)
    full_env.update(env)
    return subprocess.run(
        [sys.executable, "-m", "hyper_core", *args],
        capture_output=True,
        text=True,
        env=full_env,
        timeout=120,
    )


@pytest.fixture
def site(tmp_path: Path) -> Path:
    root = tmp_path / "site"
    root.mkdir()
    make_dist(root, "hyper-train-good", "1.2.3", "good_mod", GOOD, "good")
    return root


def records(proc: subprocess.CompletedProcess[str]) -> dict[str, dict]:
    assert proc.returncode == 0, proc.stderr
    return {r["name"]: r for r in json.loads(proc.stdout)}


def test_entry_point_plugin_is_listed_with_version_and_registrations(site: Path) -> None:
    recs = records(run_cli(["plugins", "--json"], site))
    good = recs["good"]
    assert good["distribution"] == "hyper-train-good"
    assert good["version"] == "1.2.3"
    assert good["status"] == "loaded"
    assert good["registers"] == {"model adapter": ["my_adapter"], "command": ["echo"]}
    assert "on_train_begin" in good["hooks"]
    assert recs["hyper_core.builtin.components"]["status"] == "builtin"


def test_plugins_command_imports_no_torch(site: Path) -> None:
    code = (
        "import sys; from hyper_core.cli import main; main(['plugins', '--json']); "
        "sys.stderr.write(repr(sorted(m for m in ('torch', 'transformers') if m in sys.modules)))"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("HYPER_TRAIN_")}
    env["PYTHONPATH"] = str(site)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert proc.stderr.strip().endswith("[]"), proc.stderr


def test_broken_plugin_warns_once_and_others_still_load(site: Path) -> None:
    make_dist(site, "hyper-train-broken", "0.1.0", "broken_mod", BROKEN, "broken")
    proc = run_cli(["plugins", "--json"], site)
    recs = records(proc)
    assert recs["good"]["status"] == "loaded"
    assert recs["broken"]["status"] == "failed"
    assert "boom at import" in recs["broken"]["error"]
    warning = [line for line in proc.stderr.splitlines() if "broken" in line]
    assert len(warning) == 1
    assert "hyper-train-broken 0.1.0" in warning[0] and "RuntimeError" in warning[0]


@pytest.mark.parametrize("how", ["flag", "env"])
def test_strict_mode_makes_a_broken_plugin_fatal(site: Path, how: str) -> None:
    make_dist(site, "hyper-train-broken", "0.1.0", "broken_mod", BROKEN, "broken")
    if how == "flag":
        proc = run_cli(["plugins", "--strict-plugins"], site)
    else:
        proc = run_cli(["plugins"], site, HYPER_TRAIN_STRICT_PLUGINS="1")
    assert proc.returncode == 2
    assert "broken" in proc.stderr and "Traceback" not in proc.stderr


def test_misspelled_hook_is_reported_as_failed(site: Path) -> None:
    make_dist(site, "hyper-train-typo", "0.2.0", "typo_mod", MISSPELLED, "typo")
    recs = records(run_cli(["plugins", "--json"], site))
    assert recs["typo"]["status"] == "failed"
    assert "build_modle" in recs["typo"]["error"]
    assert recs["good"]["status"] == "loaded"


def test_two_plugins_registering_one_adapter_is_an_error_naming_both(site: Path) -> None:
    make_dist(site, "hyper-train-clash", "0.3.0", "clash_mod", CLASH, "clash")
    proc = run_cli(["plugins"], site)
    assert proc.returncode == 2
    assert "'good'" in proc.stderr and "'clash'" in proc.stderr and "myadapter" in proc.stderr


@pytest.mark.parametrize(
    ("value", "loaded"),
    [(None, {"good", "other"}), ("", set()), ("good", {"good"}), ("hyper-train-other", {"other"})],
)
def test_plugin_filter_env(site: Path, value: str | None, loaded: set[str]) -> None:
    make_dist(site, "hyper-train-other", "2.0.0", "other_mod", "x = 1\n", "other")
    env = {} if value is None else {"HYPER_TRAIN_PLUGINS": value}
    recs = records(run_cli(["plugins", "--json"], site, **env))
    mine = {n: r for n, r in recs.items() if n in {"good", "other"}}
    assert {n for n, r in mine.items() if r["status"] == "loaded"} == loaded
    assert {n for n, r in mine.items() if r["status"] == "disabled"} == {"good", "other"} - loaded


def test_loading_is_idempotent_per_process() -> None:
    from hyper_core.plugins import get_plugin_host, reset_plugin_host

    reset_plugin_host()
    assert get_plugin_host() is get_plugin_host()
    host = PluginHost(entry_points=False)
    host.add_module("hyper_core.builtin.components")  # already registered as a built-in
    assert len(host.registries.model_adapters) == 1


def test_names_are_normalised() -> None:
    assert normalize_name("Qwen2_5_VLForConditionalGeneration") == normalize_name("qwen2-5-vl")
    assert normalize_name("KimiK25ForConditionalGeneration") == "kimik25"
    assert normalize_name("LlamaForCausalLM") == "llama"


def test_missing_known_adapter_names_the_distribution() -> None:
    host = PluginHost(entry_points=False)
    with pytest.raises(PluginError) as err:
        host.registries.model_adapters.get("Qwen2_5_VLForConditionalGeneration")
    assert "pip install hyper-train-qwen-vl" in str(err.value)
    assert "hf_causal_lm" in str(err.value)


def test_override_declared_replaces_the_other_registration() -> None:
    reg: Registry[object] = Registry("model adapter")
    reg.register("llava", "a:A", plugin="one")
    with pytest.raises(PluginError, match=r"'one'.*'two'"):
        reg.register("llava", "b:B", plugin="two")
    reg.register("llava", "b:B", plugin="two", overrides="llava")
    assert reg.entry("llava").plugin == "two"


def test_lazy_reference_is_imported_only_on_use() -> None:
    reg: Registry[object] = Registry("dataset format")
    reg.register("thing", "no_such_module_xyz:thing", plugin="p")
    assert "thing" in reg
    with pytest.raises(ModuleNotFoundError):
        reg.get("thing")


def test_plugin_subcommand_runs(site: Path) -> None:
    proc = run_cli(["echo", "hello"], site)
    assert proc.returncode == 3, proc.stderr
    assert proc.stdout.strip() == "echo: hello"
    helptext = run_cli(["--help"], site).stdout
    assert "run" in helptext and "say a word" in helptext


def test_each_builtin_capability_is_its_own_listed_plugin() -> None:
    """``hyper-train plugins`` lists the core's capabilities one module each, with what each
    registers (the records it prints)."""
    from hyper_core.plugins.manager import BUILTIN_PLUGINS

    recs = {r.name: r for r in PluginHost(entry_points=False).records.values()}
    assert list(recs) == list(BUILTIN_PLUGINS)
    assert {r.status for r in recs.values()} == {"builtin"}
    assert recs["hyper_core.builtin.formats"].registers == {
        "dataset format": ["jsonl", "parquet", "hf"]
    }
    assert recs["hyper_core.demo.plugin"].registers == {
        "dataset format": ["shapes", "moving_shapes"]
    }
    assert "dataset format" not in recs["hyper_core.builtin.components"].registers
    commands = ["run", "plugins", "config", "data", "export", "chat", "predict", "plot"]
    assert recs["hyper_core.cli.plugin"].registers == {"command": [*commands, "new-plugin"]}
    for module in ("progress", "moe_stats", "step_profiler"):
        assert recs[f"hyper_core.builtin.{module}"].hooks == ["build_callbacks"], module
    assert "build_callbacks" not in recs["hyper_core.builtin.stages"].hooks


def test_builtin_per_run_objects_come_each_from_its_plugin_in_order(tmp_path: Path) -> None:
    from types import SimpleNamespace

    from hyper_core.parallel.moe_stats import ExpertParallelStats
    from hyper_core.trainer.profile import StepProfiler
    from hyper_core.trainer.progress import Progress

    host = PluginHost(entry_points=False)

    def objects(is_main: bool, ep: int, profile_steps: list[int] | None) -> list[type]:
        config = SimpleNamespace(
            logging=SimpleNamespace(progress="lines", profile_steps=profile_steps),
            parallel=SimpleNamespace(ep=ep),
            run=SimpleNamespace(output_dir=str(tmp_path)),
        )
        dist = SimpleNamespace(is_main=is_main, rank=0 if is_main else 1)
        results = host.call_stage("build_callbacks", config=config, dist=dist, adapter=None)
        return [type(r) for r in results if r is not None]

    # the order the trainer registers them in (the single builtin stage's order before)
    assert objects(True, 2, [1, 2]) == [Progress, ExpertParallelStats, StepProfiler]
    assert objects(False, 2, None) == [ExpertParallelStats]
    assert objects(True, 1, None) == [Progress]
    assert objects(False, 1, None) == []
