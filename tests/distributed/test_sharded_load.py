"""Sharded loading from an HF directory (fsdp2: every rank reads only its slices) trains
exactly like the rank-0 broadcast path (ddp) and a single process."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from dist_helpers import (
    HERE,
    assert_close,
    kimi_available,
    losses,
    model_config,
    torchrun,
    train_here,
    vl_available,
)

pytestmark = pytest.mark.slow

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
    from hyper_core.builtin.resolve import resolve_adapter
    from hyper_core.config import load_config_dict
    from hyper_core.plugins import get_plugin_host

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


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    """Per model: its HF directory, and the runs sharded (fsdp2), rank 0 (ddp), one process."""
    root = tmp_path_factory.mktemp("sharded-load")
    jobs: list[dict[str, Any]] = []
    out: dict[str, dict[str, Path]] = {}
    models = ["text"] + (["vl"] if vl_available() else []) + (["kimi"] if kimi_available() else [])
    for model in models:
        hf = write_model_dir(model, root / model)
        dirs = {"hf": hf}
        for name, parallel in {
            "fsdp2": {"strategy": "fsdp2"},
            "ddp": {"strategy": "ddp"},
            "hsdp": {"strategy": "fsdp2", "dp_replicate": 2},
        }.items():
            if name == "hsdp" and model != "text":
                continue
            dirs[name] = root / model / name
            cfg = _config(model, dirs[name], hf, timeout_s=60, **parallel)
            jobs.append({"config": cfg})
        dirs["one"] = root / model / "one"
        train_here(_config(model, dirs["one"], hf))
        out[model] = dirs
    jobs_file = root / "jobs.json"
    jobs_file.write_text(json.dumps(jobs))
    proc = torchrun(HERE / "dist_worker.py", [str(jobs_file)], nproc=2, timeout=400)
    assert proc.returncode == 0, proc.stderr[-6000:]
    # the fsdp2 runs took the sharded path, the others rank 0's
    fsdp2_runs = sum(1 for job in jobs if job["config"]["parallel"]["strategy"] == "fsdp2")
    assert proc.stderr.count("reads its own shards") == fsdp2_runs, proc.stderr[-3000:]
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
