"""The plugin in one process: registration without torch, its config section, the clear error
for a model without a vision encoder (exit 2), bad ``base`` names, and world size 1 as a no-op
(installed, enabled or excluded: the same losses bit for bit)."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from ep_helpers import hyper_train, needs_vl, vl_config, write_dataset

from hyper_core.errors import ConfigError, PluginError
from hyper_core.testing import tiny_text_config
from hyper_encoder_parallel.run import EncoderParallelRun


def test_plugin_module_imports_no_torch() -> None:
    code = (
        "import sys\n"
        "import hyper_encoder_parallel.plugin, hyper_encoder_parallel.config\n"
        "import hyper_encoder_parallel.strategy, hyper_encoder_parallel.planner\n"
        "from hyper_core.plugins import PluginHost\n"
        "host = PluginHost()\n"
        "assert 'encoder_parallel' in host.registries.parallel_strategies\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'transformers')))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    )
    assert out.stdout.strip() == "[]", out.stdout


def test_plugins_command_lists_the_strategy_and_section() -> None:
    proc = hyper_train(["plugins", "--json"])
    assert proc.returncode == 0, proc.stderr
    record = next(p for p in json.loads(proc.stdout) if p["name"] == "encoder_parallel")
    assert record["status"] == "loaded"
    assert record["distribution"] == "hyper-train-encoder-parallel"
    assert record["registers"] == {
        "parallel strategy": ["encoder_parallel"],
        "config section": ["encoder_parallel"],
    }
    assert "build_callbacks" in record["hooks"]


def _load(raw: dict[str, Any]) -> Any:
    from hyper_core.config import load_config_dict
    from hyper_core.plugins import get_plugin_host

    return load_config_dict(raw, sections=get_plugin_host().registries.config_sections)


def test_config_section_is_strict_with_defaults(tmp_path: Path) -> None:
    from hyper_encoder_parallel.config import EncoderParallelConfig

    default = _load(tiny_text_config(tmp_path)).section("encoder_parallel")
    assert default == EncoderParallelConfig() and not default.enabled
    config = _load(tiny_text_config(tmp_path, encoder_parallel={"enabled": True, "min_images": 4}))
    section = config.section("encoder_parallel")
    assert section.enabled and section.min_images == 4 and section.cost_model == "patches"
    with pytest.raises(ConfigError, match=r"\$\.encoder_parallel\.enable\b.*enabled"):
        _load(tiny_text_config(tmp_path, encoder_parallel={"enable": True}))
    with pytest.raises(ConfigError, match=r"\$\.encoder_parallel\.cost_model"):
        _load(tiny_text_config(tmp_path, encoder_parallel={"cost_model": "flops"}))
    with pytest.raises(ConfigError, match=r"\$\.encoder_parallel\.min_imbalance"):
        _load(tiny_text_config(tmp_path, encoder_parallel={"min_imbalance": 0.5}))


def _write_toml(raw: dict[str, Any], path: Path) -> Path:
    from hyper_core.config import dump_config

    path.write_text(dump_config(_load(raw)))
    return path


@pytest.mark.parametrize(
    ("sections", "where"),
    [
        ({"encoder_parallel": {"enabled": True}}, "$.encoder_parallel.enabled"),
        ({"parallel": {"strategy": "encoder_parallel"}}, "$.parallel.strategy"),
    ],
)
def test_text_model_is_a_clear_user_error(
    tmp_path: Path, sections: dict[str, Any], where: str
) -> None:
    toml = _write_toml(tiny_text_config(tmp_path / "out", **sections), tmp_path / "run.toml")
    proc = hyper_train(["run", str(toml)])
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert where in proc.stderr
    assert "hf_causal_lm" in proc.stderr and "declares no vision encoder" in proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize(
    ("base", "error", "match"),
    [
        ("encoder_parallel", ConfigError, r"\$\.encoder_parallel\.base: must name"),
        ("no_such_strategy", PluginError, r"\$\.encoder_parallel\.base"),
    ],
)
def test_bad_base_strategy(tmp_path: Path, base: str, error: type, match: str) -> None:
    from hyper_core.plugins import get_plugin_host
    from hyper_core.trainer.trainer import Trainer

    raw = tiny_text_config(
        tmp_path, parallel={"strategy": "encoder_parallel"}, encoder_parallel={"base": base}
    )
    with pytest.raises(error, match=match):
        Trainer(_load(raw), get_plugin_host()).setup()


def _run_here(raw: dict[str, Any], exclude: bool = False) -> Any:
    from hyper_core.plugins.manager import PluginHost
    from hyper_core.testing import run_tiny_training

    only = ["qwen_vl"] if exclude else None
    host = PluginHost(only=only, strict=True)
    assert ("encoder_parallel" in host.registries.parallel_strategies) is not exclude
    return run_tiny_training(raw, host=host)


@needs_vl
def test_one_rank_is_a_no_op(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Excluded by the plugin filter, installed but off, enabled, or the strategy: one rank
    trains bit-identically, and enabling says so once."""
    import torch

    torch.set_num_threads(1)  # like each rank (tests/conftest.py gives the count back)
    data = write_dataset(tmp_path / "data", "skew")
    sections: dict[str, dict[str, Any]] = {"training": {"steps": 2}}
    runs = {
        "excluded": _run_here(vl_config(tmp_path / "a", data, **sections), exclude=True),
        "off": _run_here(vl_config(tmp_path / "b", data, **sections)),
    }
    with caplog.at_level(logging.INFO, logger="hyper_train.encoder_parallel"):
        runs["on"] = _run_here(
            vl_config(tmp_path / "c", data, encoder_parallel={"enabled": True}, **sections)
        )
    noted = [r for r in caplog.records if "one rank, nothing to balance" in r.getMessage()]
    assert len(noted) == 1
    runs["strategy"] = _run_here(
        vl_config(
            tmp_path / "d",
            data,
            parallel={"strategy": "encoder_parallel"},
            encoder_parallel={"base": "ddp"},
            **sections,
        )
    )
    reference = runs["excluded"]
    assert len(reference.losses) == 2
    for name, run in runs.items():
        assert run.losses == reference.losses, name
        assert [m["grad_norm"] for m in run.metrics] == [
            m["grad_norm"] for m in reference.metrics
        ], name
        assert not any(k.startswith("encoder_parallel/") for m in run.metrics for k in m)
        ours = [cb for cb in run.trainer.callbacks if isinstance(cb, EncoderParallelRun)]
        assert len(ours) == (name in ("on", "strategy")), name
        assert all(cb.balancer is None for cb in ours)  # one rank: nothing installed


def test_context_parallel_is_refused_before_the_strategy_applies() -> None:
    # [parallel] cp shares out the tower over each cp group itself (hyper_core.parallel.cp_vision)
    from hyper_core.adapters.base import ParallelPlan, VisionEncoderSpec
    from hyper_core.parallel.env import DistEnv
    from hyper_encoder_parallel.config import EncoderParallelConfig

    class Adapter:
        name = "vl"

        def parallel_plan(self, model: Any) -> ParallelPlan:
            return ParallelPlan(
                sharding_units=(), vision_encoder=VisionEncoderSpec(module="visual")
            )

        def split_vision_inputs(self, model_inputs: Any, context: Any) -> list[dict[str, Any]]:
            return []

        def call_vision_encoder(self, model: Any, vision_inputs: Any, context: Any) -> Any:
            return None

        def inject_vision_outputs(
            self, model_inputs: Any, outputs: Any, context: Any
        ) -> dict[str, Any]:
            return {}

    run = EncoderParallelRun(EncoderParallelConfig(enabled=True), "$.encoder_parallel.enabled")
    hook = run.parallelize_model(None, Adapter(), DistEnv(world_size=2, cp=2), None)
    with pytest.raises(ConfigError, match=r"\$\.encoder_parallel\.enabled: does not combine"):
        next(hook)
    # without cp the strategy runs (the wrapper yields to it)
    hook = run.parallelize_model(None, Adapter(), DistEnv(world_size=2), None)
    next(hook)
