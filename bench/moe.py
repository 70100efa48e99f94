"""Expert parallelism: step time, expert bytes per rank and all-to-all volume, ep = 2 vs 1.

2 ranks (``fsdp2``, gloo on CPU), a small Qwen3-VL-MoE (text hidden 256, 4 layers, 16
experts of width 256, top 4) on the synthetic ``shapes`` data, ``hyper-train run
--nproc-per-node 2``. The same config runs with ``ep = 1`` (FSDP2 gathers every expert of a
layer) and ``ep = 2`` (each rank holds and computes half of them; tokens go all-to-all),
alternating. Step time: the median of rank 0's ``step_time_s`` after ``WARMUP`` steps. Expert
bytes: what a rank holds (``moe/expert_param_bytes``; the same under both, since FSDP2 shards
experts too) and what one layer gathers in flight (``E / ep`` experts). All-to-all volume: the
rows (``moe/a2a_rows_per_step``) × hidden × 4 bytes, out and back, forward and backward.
No claim for GPUs: on 2 CPU cores the ranks share the cores.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from .runner import Ratio, Result

WARMUP = 2
HIDDEN, EXPERTS, WIDTH, TOP_K, LAYERS = 256, 16, 256, 4, 4


def _config(out: Path, ep: int, steps: int) -> dict[str, Any]:
    return {
        "run": {"output_dir": str(out), "seed": 0},
        "model": {
            "adapter": "qwen3_vl_moe",
            "config": "tiny",
            "hf_overrides": {
                "text_config.hidden_size": HIDDEN,
                "text_config.num_hidden_layers": LAYERS,
                "text_config.num_experts": EXPERTS,
                "text_config.moe_intermediate_size": WIDTH,
                "text_config.num_experts_per_tok": TOP_K,
                "vision_config.out_hidden_size": HIDDEN,
            },
        },
        "data": {"train": {"format": "shapes", "num_samples": 16 * steps}, "max_seq_len": 512},
        "training": {
            "steps": steps,
            "global_batch_size": 8,
            "micro_batch_size": 2,
            "lr": 1e-4,
            "warmup_steps": 0,
        },
        "parallel": {"strategy": "fsdp2", "ep": ep},
        "logging": {"every_steps": 1, "progress": "none"},
        "checkpoint": {"resume": "none", "save_final": False},
    }


def _run(root: Path, ep: int, steps: int, repeat: int) -> list[dict[str, Any]]:
    from hyper_core.config import dump_config, load_config_dict
    from hyper_core.plugins import get_plugin_host

    out = root / f"ep{ep}-{repeat}"
    raw = _config(out, ep, steps)
    config = load_config_dict(raw, sections=get_plugin_host().registries.config_sections)
    path = root / f"ep{ep}.toml"
    path.write_text(dump_config(config))
    cmd = [sys.executable, "-m", "hyper_core", "run", str(path), "--nproc-per-node", "2"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=1800, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"ep={ep} failed:\n{proc.stderr[-4000:]}")
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def run(size: str = "full") -> Result:
    """ep = 1 and ep = 2, alternating, ``repeats`` times."""
    steps, repeats = (6, 1) if size == "ci" else (12, 2)
    result = Result("moe", "expert parallelism on 2 CPU ranks: ep = 2 vs ep = 1")
    layer_expert_bytes = 3 * EXPERTS * WIDTH * HIDDEN * 4  # gate, up, down; fp32
    result.params = {
        "hidden": HIDDEN,
        "experts": EXPERTS,
        "top_k": TOP_K,
        "layers": LAYERS,
        "steps": steps,
        "tokens_per_step": "8 samples of the shapes data",
    }
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        for repeat in range(repeats):
            for ep in (1, 2):
                records = _run(root, ep, steps, repeat)
                times = [r["step_time_s"] for r in records[WARMUP:]]
                result.figure(f"ep{ep}_step_s", "s").values.append(statistics.median(times))
                result.figure(f"ep{ep}_layer_experts_gathered_bytes", "B").values.append(
                    layer_expert_bytes / ep
                )
                if ep == 2:
                    rows = statistics.mean(r["moe/a2a_rows_per_step"] for r in records)
                    held = records[0]["moe/expert_param_bytes"]
                    result.figure("ep2_expert_bytes_per_rank", "B").values.append(held)
                    result.figure("ep2_a2a_rows_per_step", "rows").values.append(rows)
                    result.figure("ep2_a2a_bytes_per_step", "B").values.append(
                        rows * HIDDEN * 4 * 2 * 2
                    )
    result.ratios["ep2_vs_ep1_step_time"] = Ratio("ep2_step_s", "ep1_step_s")
    result.notes.append(
        "FSDP2 shards experts under ep = 1 too, so the bytes held per rank are the same; "
        "ep = 2 halves what a layer gathers and replaces the gather by the all-to-all."
    )
    return result
