"""Measuring a model load: seconds and peak RSS per rank, the sharded path against rank 0's.

    python -m torch.distributed.run --standalone --nproc-per-node N \\
        -m hyper_core.testing.load_probe CONFIG.toml OUT.json [--rank0] [--compare] [--export DIR]

Each rank runs the real ``build_model`` and ``parallelize_model`` stages of CONFIG (a
``[model] path`` run) and records the wall time and the rise of its peak resident memory
(``VmHWM`` after the load and a read of every weight, minus ``VmRSS`` before, with the peak
reset first). ``--rank0`` takes the rank-0 broadcast path (rank 0 loads the whole
checkpoint) instead of the sharded one; ``--compare`` checks every rank's shards against a
single-process ``from_pretrained`` on rank 0, tensor by tensor. Rank 0 writes OUT.json. Used by
``python -m bench load`` and the big-checkpoint tests; :func:`write_random_checkpoint` writes
their checkpoint.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import sys
import time
from pathlib import Path
from typing import Any

import attrs

#: Per decoder layer of :func:`big_qwen_vl_overrides`: 4·H² (attention, GQA 2:1 → 3·H²) +
#: 3·H·I (MLP) parameters.
_HIDDEN, _INTERMEDIATE = 1024, 3584


def big_qwen_vl_overrides(target_bytes: int) -> dict[str, Any]:
    """``hf_overrides`` turning the ``tiny`` Qwen2.5-VL into ~``target_bytes`` of fp32."""
    per_layer = (3 * _HIDDEN * _HIDDEN + 3 * _HIDDEN * _INTERMEDIATE) * 4
    layers = max(1, math.ceil(target_bytes / per_layer))
    return {
        "text_config": {
            "hidden_size": _HIDDEN,
            "intermediate_size": _INTERMEDIATE,
            "num_hidden_layers": layers,
            "num_attention_heads": 16,
            "num_key_value_heads": 8,
        },
        "vision_config": {"out_hidden_size": _HIDDEN},
    }


def model_section(path: Path | None = None, *, target_bytes: int = 0) -> dict[str, Any]:
    """``[model]`` of the big Qwen2.5-VL: built from ``tiny`` + overrides, or read from
    ``path``."""
    if path is not None:
        return {"adapter": "qwen2_5_vl", "path": str(path)}
    return {
        "adapter": "qwen2_5_vl",
        "config": "tiny",
        "hf_overrides": big_qwen_vl_overrides(target_bytes),
    }


def run_config(model: dict[str, Any], out: Path, **parallel: Any) -> dict[str, Any]:
    """A minimal run config around ``model`` (the probe never trains)."""
    return {
        "run": {"output_dir": str(out), "seed": 0},
        "model": model,
        "data": {"train": {"format": "shapes", "num_samples": 8}},
        "training": {"steps": 1, "global_batch_size": 8, "micro_batch_size": 1, "lr": 1e-5},
        "parallel": {"strategy": "fsdp2", "timeout_s": 600, **parallel},
        "logging": {"progress": "none"},
    }


def write_random_checkpoint(out: Path, target_bytes: int, max_shard_size: str = "300MB") -> int:
    """A random Qwen2.5-VL-shaped checkpoint of about ``target_bytes`` (fp32 safetensors,
    sharded with an index) in ``out``; returns its size in bytes."""
    import torch

    from ..config import load_config_dict
    from ..plugins import get_plugin_host
    from ..resolve import resolve_adapter

    config = load_config_dict(run_config(model_section(target_bytes=target_bytes), out))
    adapter = resolve_adapter(config.model, get_plugin_host().registries)
    torch.manual_seed(0)
    model = adapter.build_model(config.model)
    model.save_pretrained(str(out), max_shard_size=max_shard_size, safe_serialization=True)
    del model
    return sum(f.stat().st_size for f in out.glob("*.safetensors"))


def _status_bytes(field: str) -> int:
    text = Path("/proc/self/status").read_text()
    match = re.search(rf"^{field}:\s+(\d+) kB", text, re.MULTILINE)
    return int(match.group(1)) * 1024 if match else 0


def _reset_peak() -> None:
    """Make ``VmHWM`` the current RSS (Linux: ``echo 5 > /proc/self/clear_refs``)."""
    Path("/proc/self/clear_refs").write_text("5")


def probe(
    config_file: Path,
    out_json: Path,
    *,
    rank0: bool,
    compare: bool,
    export: Path | None = None,
    shard_size: str = "200MB",
) -> None:
    """Load the model of ``config_file`` on this rank and record the figures (see module);
    with ``export``, then export it there as ``[checkpoint] export_hf`` does and record each
    rank's peak RSS rise during the export too."""
    import torch
    import torch.distributed as tdist

    from ..config import load_config
    from ..plugins import get_plugin_host
    from ..resolve import resolve_adapter, resolve_strategy

    host = get_plugin_host()
    config = load_config(config_file, [], host.registries.config_sections)
    dist = host.call_stage("setup_distributed", config=config)
    adapter = resolve_adapter(config.model, host.registries)
    strategy = resolve_strategy(config, host.registries)
    load = host.call_stage(
        "plan_load", config=config, adapter=adapter, dist=dist, strategy=strategy
    )
    if rank0:
        load = attrs.evolve(load, sharded_load=False)
    # Import the model's modules first: their memory is not the load's.
    adapter.build_model(config.model, device="meta")
    if dist.world_size > 1:
        tdist.barrier()
    _reset_peak()
    before = _status_bytes("VmRSS")
    t0 = time.perf_counter()
    model = host.call_stage("build_model", config=config, adapter=adapter, dist=dist, load=load)
    model = host.call_stage(
        "parallelize_model",
        config=config,
        model=model,
        adapter=adapter,
        dist=dist,
        strategy=strategy,
        load=load,
    )
    seconds = time.perf_counter() - t0
    # Read every weight once: one process's from_pretrained maps the files and leaves pages
    # not yet read out of RSS, which would flatter it.
    with torch.no_grad():
        for tensor in model.state_dict().values():
            (tensor.to_local() if hasattr(tensor, "to_local") else tensor).sum()
    peak = _status_bytes("VmHWM") - before
    worst = _compare(model, adapter, config, dist) if compare else None
    export_peak = _export(model, adapter, dist, export, shard_size) if export else -1
    values = [peak, seconds, -1.0 if worst is None else worst, export_peak]
    record = torch.tensor(values, dtype=torch.float64)
    records = [torch.zeros_like(record) for _ in range(dist.world_size)]
    if dist.world_size > 1:
        tdist.all_gather(records, record)
    else:
        records = [record]
    if dist.is_main:
        path = Path(config.model.path)
        size = sum(f.stat().st_size for f in path.glob("*.safetensors"))
        result = {
            "ranks": dist.world_size,
            "path": "rank0" if rank0 else "sharded",
            "checkpoint_bytes": size,
            "peak_rss_bytes": [int(r[0]) for r in records],
            "seconds": [float(r[1]) for r in records],
            "max_abs_diff": None if worst is None else max(float(r[2]) for r in records),
            "export_peak_rss_bytes": [int(r[3]) for r in records] if export else None,
        }
        out_json.write_text(json.dumps(result, indent=2) + "\n")
    if dist.world_size > 1:
        tdist.barrier()
        tdist.destroy_process_group()


def _export(model: Any, adapter: Any, dist: Any, out_dir: Path, shard_size: str) -> int:
    """Export ``model`` (streamed, as at the end of a run); this rank's peak RSS rise."""
    from types import SimpleNamespace

    import torch.distributed as tdist

    from ..export import export_trained_model

    trainer = SimpleNamespace(
        model=model, unwrapped_model=model, dist=dist, adapter=adapter, assets=None
    )
    if dist.world_size > 1:
        tdist.barrier()
    _reset_peak()
    before = _status_bytes("VmRSS")
    export_trained_model(trainer, out_dir, max_shard_size=shard_size)
    return _status_bytes("VmHWM") - before


def _compare(model: Any, adapter: Any, config: Any, dist: Any) -> float:
    """Largest |difference| of the loaded model from a single-process ``from_pretrained``
    (on rank 0, whole tensor by whole tensor; a collective). Other ranks return 0."""
    reference = adapter.build_model(config.model).state_dict() if dist.is_main else {}
    worst = 0.0
    for name, tensor in model.state_dict().items():
        full = tensor.full_tensor() if hasattr(tensor, "full_tensor") else tensor
        if dist.is_main:
            worst = max(worst, (full.float() - reference[name].float()).abs().max().item())
        del full
    return worst


def launch(
    config_file: Path, out_json: Path, nproc: int, *flags: str, timeout: float = 900
) -> dict[str, Any]:
    """Run the probe on ``nproc`` ranks (torchrun, gloo) and return its record."""
    import subprocess

    from .processes import subprocess_env

    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    cmd += [f"--nproc-per-node={nproc}", "-m", __name__, str(config_file), str(out_json), *flags]
    proc = subprocess.run(
        cmd, env=subprocess_env(), capture_output=True, text=True, timeout=timeout, check=False
    )
    if proc.returncode != 0:
        raise RuntimeError(f"load probe failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
    return json.loads(out_json.read_text())


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m hyper_core.testing.load_probe")
    parser.add_argument("config", type=Path)
    parser.add_argument("out", type=Path)
    parser.add_argument("--rank0", action="store_true", help="the rank-0 broadcast path")
    parser.add_argument("--compare", action="store_true", help="check against from_pretrained")
    parser.add_argument("--export", type=Path, help="then export the model there (HF layout)")
    args = parser.parse_args(argv)
    probe(args.config, args.out, rank0=args.rank0, compare=args.compare, export=args.export)
    # The record is written and every rank has left the group: skip the interpreter's
    # teardown, where a 4-rank run on 2 cores once aborted in a C++ destructor
    # ("terminate called without an active exception") after its work was done.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
