"""Sharded loading from an HF directory (fsdp2: every rank reads only its slices; ddp: every
rank reads all of it) trains exactly like a single process."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from dist_helpers import (
    TwoRankRuns,
    assert_close,
    kimi_available,
    losses,
    model_config,
    train_here,
    vl_available,
)

pytestmark = pytest.mark.slow
TWO_RANK_TIMEOUT_S = 400

MODELS = [
    "text",  # tied embeddings: lm_head is not in the checkpoint
    pytest.param("vl", marks=pytest.mark.skipif(not vl_available(), reason="no qwen-vl")),
    pytest.param("kimi", marks=pytest.mark.skipif(not kimi_available(), reason="no kimi")),
]
STEPS = 5


def write_model_dir(model: str, out: Path) -> Path:
    """The model of ``model_config(model)`` (random init, seed 0) written as a published
    checkpoint would be: Qwen-VL's legacy key names, Kimi's per-expert keys, with its
    tokenizer and processor."""
    from hyper_core.config import load_config_dict
    from hyper_core.plugins import get_plugin_host
    from hyper_core.resolve import resolve_adapter

    host = get_plugin_host()
    config = load_config_dict(model_config(model, out / "unused"))
    adapter = resolve_adapter(config.model, host.registries)
    import torch

    torch.manual_seed(0)
    built = adapter.build_model(config.model)
    assets = adapter.build_assets(config.model)
    target = out / "hf"
    adapter.export_hf(built.state_dict(), built.config, target, assets=assets)
    return target


def _config(model: str, out: Path, path: Path, **parallel: Any) -> dict[str, Any]:
    cfg = model_config(model, out, training={"steps": STEPS}, parallel=parallel)
    cfg["model"] = {**{k: v for k, v in cfg["model"].items() if k != "config"}, "path": str(path)}
    return cfg


PARALLEL = {
    "fsdp2": {"strategy": "fsdp2"},
    "ddp": {"strategy": "ddp"},
    "hsdp": {"strategy": "fsdp2", "dp_replicate": 2},
}


def _models() -> list[str]:
    return ["text"] + (["vl"] if vl_available() else []) + (["kimi"] if kimi_available() else [])


def _runs_of(model: str) -> list[str]:
    return [name for name in PARALLEL if name != "hsdp" or model == "text"]


def two_rank_jobs(root: Path) -> list[dict[str, Any]]:
    """Per model, its HF directory (written here) and the runs sharded (fsdp2) and from rank 0
    (ddp): this module's jobs of the shared 2-rank launch (``conftest.two_rank_runs``)."""
    jobs: list[dict[str, Any]] = []
    for model in _models():
        hf = write_model_dir(model, root / model)
        for name in _runs_of(model):
            cfg = _config(model, root / model / name, hf, timeout_s=60, **PARALLEL[name])
            jobs.append({"config": cfg})
    return jobs


@pytest.fixture(scope="module")
def runs(two_rank_runs: TwoRankRuns) -> dict[str, dict[str, Any]]:
    """Per model: its HF directory, and the runs sharded (fsdp2), rank 0 (ddp), one process."""
    root = two_rank_runs.dir(__name__)
    out: dict[str, dict[str, Any]] = {}
    for model in _models():
        dirs = {"hf": root / model / "hf"}
        for name in _runs_of(model):
            dirs[name] = root / model / name
            # every rank read [model] path itself (fsdp2 its shards, ddp the whole of it)
            log = two_rank_runs.log(dirs[name])
            assert log.count("reads its own shards") == 1, log[-3000:]
        dirs["one"] = root / model / "one"
        train_here(_config(model, dirs["one"], dirs["hf"]))
        out[model] = dirs
    return out


@pytest.mark.parametrize("model", MODELS)
def test_sharded_load_trains_like_rank0_and_one_process(
    runs: dict[str, dict[str, Any]], model: str
) -> None:
    dirs = runs[model]
    one = losses(dirs["one"])
    assert sorted(one) == list(range(1, STEPS + 1))
    assert_close(losses(dirs["fsdp2"]), one, 1e-5)
    assert_close(losses(dirs["ddp"]), one, 1e-5)
    if "hsdp" in dirs:
        assert_close(losses(dirs["hsdp"]), one, 1e-5)
