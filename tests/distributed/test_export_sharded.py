"""Export from a 2-rank fsdp2 run, streamed group by group from the shards (``[checkpoint]
export_hf``) and from its DCP checkpoint (``hyper-train export``): ``from_pretrained`` gives
the trained weights and logits, for a tied-embedding text model, Qwen2.5-VL and Kimi-K2.5."""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any

import pytest
from dist_helpers import (
    HERE,
    kimi_available,
    model_config,
    torchrun,
    vl_available,
    write_toml,
)

pytestmark = pytest.mark.slow

STEPS = 3
MODELS = [
    "text",  # tied embeddings
    pytest.param("vl", marks=pytest.mark.skipif(not vl_available(), reason="no qwen-vl")),
    pytest.param("kimi", marks=pytest.mark.skipif(not kimi_available(), reason="no kimi")),
]
#: Text-only probe ids clear of every tiny tokenizer's special (image) tokens.
PROBE_IDS = list(range(20, 52))


def _config(model: str, out: Path) -> dict[str, Any]:
    return model_config(
        model,
        out,
        training={"steps": STEPS},
        parallel={"strategy": "fsdp2", "timeout_s": 120},
        checkpoint={"every_steps": STEPS, "keep_last": None, "export_hf": True},
    )


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("export-sharded")
    models = ["text"] + (["vl"] if vl_available() else []) + (["kimi"] if kimi_available() else [])
    out = {model: root / model for model in models}
    jobs = [
        {"config": _config(model, path), "probe": model == "text"} for model, path in out.items()
    ]
    jobs_file = root / "jobs.json"
    jobs_file.write_text(json.dumps(jobs))
    proc = torchrun(HERE / "dist_worker.py", [str(jobs_file)], nproc=2, timeout=400)
    assert proc.returncode == 0, proc.stderr[-6000:]
    assert proc.stderr.count("export: wrote shard") >= len(models), proc.stderr[-3000:]
    return out


def _checkpoint_model(out: Path) -> Any:
    """The run's final DCP checkpoint, loaded whole in this process (the reference)."""
    import torch.distributed.checkpoint as dcp

    from hyper_core.builtin.resolve import resolve_adapter
    from hyper_core.config import load_config
    from hyper_core.parallel.materialize import materialize
    from hyper_core.plugins import get_plugin_host

    host = get_plugin_host()
    config = load_config(out / "config.toml", [], host.registries.config_sections)
    adapter = resolve_adapter(config.model, host.registries)
    model = adapter.build_model(config.model, device="meta")
    materialize(model, "cpu")
    state = {"model": model.state_dict()}
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r"torch\.distributed is disabled")
        dcp.load(state, checkpoint_id=str(out / "checkpoints" / f"step-{STEPS}"), no_dist=True)
    model.load_state_dict(state["model"])
    return model.eval()


def _logits(model: Any) -> Any:
    import torch

    with torch.no_grad():
        ids = torch.tensor([PROBE_IDS])
        return model(input_ids=ids, use_cache=False).logits.float()


def _assert_same_model(loaded: Any, reference: Any) -> None:
    import torch

    ours, ref = loaded.state_dict(), reference.state_dict()
    assert ours.keys() == ref.keys()
    for name, tensor in ref.items():
        assert torch.equal(ours[name], tensor), name
    torch.testing.assert_close(_logits(loaded.eval()), _logits(reference), atol=1e-5, rtol=0)


@pytest.mark.parametrize("model", MODELS)
def test_export_hf_from_fsdp2_shards_loads_the_trained_model(
    runs: dict[str, Path], model: str
) -> None:
    import torch

    out = runs[model]
    reference = _checkpoint_model(out)
    loaded = type(reference).from_pretrained(str(out / "hf"), local_files_only=True)
    _assert_same_model(loaded, reference)
    if model == "text":  # the live sharded model of the run, not only its checkpoint
        trained = torch.load(out / "probe_logits.pt")
        with torch.no_grad():
            ids = torch.tensor([list(range(3, 35))])
            got = loaded(input_ids=ids, use_cache=False).logits.float()
        torch.testing.assert_close(got, trained, atol=1e-5, rtol=0)
        weights = set()
        for file in (out / "hf").glob("*.safetensors"):
            from safetensors import safe_open

            with safe_open(str(file), "pt") as f:
                weights.update(f.keys())
        assert "lm_head.weight" not in weights  # tied, as save_pretrained writes it


@pytest.mark.parametrize("model", MODELS)
def test_export_command_on_the_two_rank_checkpoint_in_small_shards(
    runs: dict[str, Path], model: str, tmp_path: Path
) -> None:
    from hyper_core.cli import main

    out = runs[model]
    target = tmp_path / "hf"
    ckpt = out / "checkpoints" / f"step-{STEPS}"
    assert main(["export", str(ckpt), "--out", str(target), "--max-shard-size", "60KB"]) == 0
    index = json.loads((target / "model.safetensors.index.json").read_text())
    shards = set(index["weight_map"].values())
    assert len(shards) > 2 and shards == {p.name for p in target.glob("*.safetensors")}
    reference = _checkpoint_model(out)
    loaded = type(reference).from_pretrained(str(target), local_files_only=True)
    _assert_same_model(loaded, reference)


# -- a checkpoint that is big for this machine --------------------------------------------------

BIG = 1_500_000_000


def export_probe(config_file: Path, out_dir: Path, out_json: Path) -> None:
    """One rank: load CONFIG's ``[model] path`` sharded (fsdp2), then export it as
    ``[checkpoint] export_hf`` does; rank 0 writes every rank's peak RSS rise during the export."""
    from types import SimpleNamespace

    import torch
    import torch.distributed as tdist

    from hyper_core.builtin.resolve import resolve_adapter, resolve_strategy
    from hyper_core.config import load_config
    from hyper_core.export import export_trained_model
    from hyper_core.plugins import get_plugin_host
    from hyper_core.testing.load_probe import _reset_peak, _status_bytes

    host = get_plugin_host()
    config = load_config(config_file, [], host.registries.config_sections)
    dist = host.call_stage("setup_distributed", config=config)
    adapter = resolve_adapter(config.model, host.registries)
    strategy = resolve_strategy(config, host.registries)
    dist.meta_init = strategy.meta_init and dist.world_size > 1
    dist.sharded_load = dist.meta_init and strategy.loads_shards
    model = host.call_stage("build_model", config=config, adapter=adapter, dist=dist)
    model = host.call_stage(
        "parallelize_model",
        config=config,
        model=model,
        adapter=adapter,
        dist=dist,
        strategy=strategy,
    )
    with torch.no_grad():  # every local shard resident before the measurement
        for tensor in model.state_dict().values():
            (tensor.to_local() if hasattr(tensor, "to_local") else tensor).sum()
    trainer = SimpleNamespace(
        model=model, unwrapped_model=model, dist=dist, adapter=adapter, assets=None
    )
    tdist.barrier()
    _reset_peak()
    before = _status_bytes("VmRSS")
    export_trained_model(trainer, out_dir, max_shard_size="200MB")
    rise = torch.tensor([_status_bytes("VmHWM") - before], dtype=torch.float64)
    rises = [torch.zeros_like(rise) for _ in range(dist.world_size)]
    tdist.all_gather(rises, rise)
    if dist.is_main:
        out_json.write_text(json.dumps([int(r.item()) for r in rises]) + "\n")
    tdist.barrier()
    tdist.destroy_process_group()


@pytest.mark.skipif(not vl_available(), reason="no qwen-vl")
def test_export_of_a_big_checkpoint_holds_one_group_and_one_shard(tmp_path: Path) -> None:
    from safetensors import safe_open

    from hyper_core.testing import load_probe

    source = tmp_path / "source"
    size = load_probe.write_random_checkpoint(source, BIG, max_shard_size="400MB")
    raw = load_probe.run_config(load_probe.model_section(source), tmp_path / "run")
    config = write_toml(raw, tmp_path / "run.toml")
    out, record = tmp_path / "hf", tmp_path / "rss.json"
    proc = torchrun(Path(__file__), [str(config), str(out), str(record)], nproc=2, timeout=900)
    assert proc.returncode == 0, proc.stderr[-6000:]
    ratios = [rise / size for rise in json.loads(record.read_text())]
    print(f"export on 2 ranks: peak RSS rise / checkpoint = {[round(r, 3) for r in ratios]}")
    assert max(ratios) <= 0.6, ratios
    shards = list(out.glob("model-*-of-*.safetensors"))
    assert len(shards) >= 7  # 200 MB shards
    # the very tensors of the source checkpoint, under its names
    source_map = json.loads((source / "model.safetensors.index.json").read_text())["weight_map"]
    export_map = json.loads((out / "model.safetensors.index.json").read_text())["weight_map"]
    assert export_map.keys() == source_map.keys()
    for shard in sorted(set(export_map.values())):
        with safe_open(str(out / shard), "pt") as ours:
            for name in ours.keys():
                with safe_open(str(source / source_map[name]), "pt") as theirs:
                    assert ours.get_tensor(name).equal(theirs.get_tensor(name)), name


if __name__ == "__main__":
    import sys

    export_probe(Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3]))
