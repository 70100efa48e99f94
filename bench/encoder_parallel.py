"""Encoder parallelism: vision-encoder time per rank and step time, balancing on vs off.

2 ranks (``ddp``, gloo on CPU; nccl on GPUs), skewed multimodal data: rank 0 holds 4× the
images of rank 1, and larger ones. The same data, model and seed run with
``[encoder_parallel] enabled`` false and true, alternating, in one ``torchrun`` launch. Each
rank times its vision tower (forward hooks, device-synchronised) per step; rank 0's
``metrics.jsonl`` gives the step time and the imbalance (max/mean encoder cost over ranks)
before and after balancing. The first ``WARMUP`` steps of each run are left out.

Run as ``python -m bench encoder_parallel``; the rank processes run this module with
``--worker JOBS.json``.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from hyper_core.hookspecs import hookimpl

from .runner import Ratio, Result

REPO = Path(__file__).resolve().parents[1]
WARMUP = 2
GLOBAL_BATCH, MICRO_BATCH = 8, 2

#: The vision tower of the full size (text stays tiny, so the encoder dominates the step).
VISION_OVERRIDES: dict[str, Any] = {
    "vision_config": {
        "hidden_size": 128,
        "intermediate_size": 256,
        "depth": 4,
        "num_heads": 4,
        "out_hidden_size": 64,
    }
}
BIG = {"ci": [(224, 224), (280, 168), (168, 168)], "full": [(448, 336), (392, 392), (336, 224)]}
SMALL = {"ci": (84, 84), "full": (168, 112)}


def _write_data(root: Path, size: str, steps: int) -> Path:
    """Rank 0: two big images per sample; rank 1: one small image per micro-batch."""
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(0)
    names = []
    for i, (h, w) in enumerate([*BIG[size], SMALL[size]]):
        name = f"img{i}.png"
        Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)).save(root / name)
        names.append(name)
    big, small = names[:-1], names[-1]
    rows = []
    for step in range(steps):
        for j in range(4):  # rank 0
            pair = [big[(step + j) % len(big)], big[(step + 2 * j + 1) % len(big)]]
            rows.append(_sample(pair, j))
        for j in range(4):  # rank 1: one image per micro-batch of two
            rows.append(_sample([small] if j % 2 == 0 else [], j))
    path = root / "skew.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return path


def _sample(images: list[str], i: int) -> dict[str, Any]:
    content: list[dict[str, str]] = [{"type": "image", "image": n} for n in images]
    content.append({"type": "text", "text": f"Describe picture {i}."})
    return {
        "messages": [
            {"role": "user", "content": content},
            {"role": "assistant", "content": "a red circle on a light background"},
        ]
    }


def _config(out: Path, data: Path, size: str, steps: int, enabled: bool) -> dict[str, Any]:
    model: dict[str, Any] = {"adapter": "qwen2_5_vl", "config": "tiny"}
    if size == "full":
        model["hf_overrides"] = VISION_OVERRIDES
    return {
        "run": {"output_dir": str(out), "seed": 0},
        "model": model,
        "data": {
            "train": str(data),
            "max_seq_len": 4096,
            "batching": "packed",
            "shuffle": False,
            "num_workers": 0,
        },
        "training": {
            "steps": steps,
            "global_batch_size": GLOBAL_BATCH,
            "micro_batch_size": MICRO_BATCH,
            "lr": 1e-4,
        },
        "parallel": {"strategy": "ddp"},
        "logging": {"every_steps": 1, "progress": "none"},
        "checkpoint": {"resume": "none"},
        "encoder_parallel": {"enabled": enabled},
    }


def run(size: str = "full") -> Result:
    """Off vs on, alternating (1 pair at CI size, 2 at full size)."""
    steps = 5 if size == "ci" else 12
    repeats = 1 if size == "ci" else 2
    result = Result(
        "encoder_parallel",
        "2 ranks, rank 0 with 4× the images: vision-encoder time per rank and step time, "
        "balancing on vs off",
    )
    result.params.update(
        size=size,
        steps=steps,
        warmup_steps=WARMUP,
        repeats=repeats,
        strategy="ddp",
        global_batch=GLOBAL_BATCH,
        micro_batch=MICRO_BATCH,
        images_per_step={"rank0": 8, "rank1": 2},
    )
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        data = _write_data(root, size, steps)
        jobs = [
            {
                "side": side,
                "config": _config(root / f"{side}-{rep}", data, size, steps, side == "on"),
            }
            for rep in range(repeats)
            for side in ("off", "on")
        ]
        (root / "jobs.json").write_text(json.dumps(jobs))
        env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
        cmd += ["--nproc-per-node=2", "-m", "bench.encoder_parallel", "--worker"]
        t0 = time.perf_counter()
        proc = subprocess.run(
            [*cmd, str(root / "jobs.json")],
            cwd=REPO,
            env=env,
            capture_output=True,
            text=True,
            check=False,
        )
        if proc.returncode != 0:
            raise RuntimeError(f"the benchmark's ranks failed:\n{proc.stderr[-4000:]}")
        result.params["wall_s"] = round(time.perf_counter() - t0, 1)
        for job in jobs:
            _collect(result, job["side"], Path(job["config"]["run"]["output_dir"]))
    for name in ("encoder_max_rank", "step"):
        result.ratios[f"{name}_time_off_over_on"] = Ratio(f"off_{name}_time", f"on_{name}_time")
    result.ratios["imbalance_before_over_after"] = Ratio(
        "on_imbalance_before", "on_imbalance_after"
    )
    result.notes.append(
        "encoder times are per optimizer step (4 micro-steps per rank), device-synchronised; "
        "on a shared 2-core CPU both ranks compete for the cores, so the step-time gain is "
        "smaller than on one accelerator per rank"
    )
    return result


def _collect(result: Result, side: str, out: Path) -> None:
    ranks = [json.loads((out / f"encoder_ms-rank{r}.json").read_text()) for r in range(2)]
    per_rank = [r[WARMUP:] for r in ranks]
    for r, times in enumerate(per_rank):
        result.figure(f"{side}_encoder_rank{r}_time", "ms").values.append(statistics.median(times))
    result.figure(f"{side}_encoder_max_rank_time", "ms").values.append(
        statistics.median(max(a, b) for a, b in zip(*per_rank, strict=True))
    )
    metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    metrics = [m for m in metrics if "loss" in m][WARMUP:]
    result.figure(f"{side}_step_time", "s").values.append(
        statistics.median(m["step_time_s"] for m in metrics)
    )
    if side == "on":
        for key in ("before", "after"):
            result.figure(f"on_imbalance_{key}", "max/mean").values.append(
                statistics.mean(m[f"encoder_parallel/imbalance_{key}"] for m in metrics)
            )


# -- the rank processes ---------------------------------------------------------------------------


class _EncoderClock:
    """Times the vision tower's forwards on this rank; one total per optimizer step."""

    def __init__(self) -> None:
        self.device: Any = None
        self.total_ms = 0.0
        self.per_step: list[float] = []
        self._t0 = 0.0
        self._handles: list[Any] = []

    def attach(self, module: Any, device: Any) -> None:
        self.device, self.total_ms, self.per_step = device, 0.0, []
        self._handles = [
            module.register_forward_pre_hook(self._start),
            module.register_forward_hook(self._stop),
        ]

    def detach(self) -> None:
        for handle in self._handles:
            handle.remove()

    def _sync(self) -> None:
        import torch

        if self.device is not None and self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def _start(self, *_: Any) -> None:
        self._sync()
        self._t0 = time.perf_counter()

    def _stop(self, *_: Any) -> None:
        self._sync()
        self.total_ms += (time.perf_counter() - self._t0) * 1e3

    @hookimpl
    def on_step_end(self) -> None:
        """Lifecycle hook: close the step's total."""
        self.per_step.append(self.total_ms)
        self.total_ms = 0.0


def _worker(jobs_file: str) -> None:
    import logging
    import warnings

    import torch.distributed as dist

    from hyper_core.config import load_config_dict
    from hyper_core.plugins.manager import PluginHost
    from hyper_core.trainer.trainer import Trainer

    rank = int(os.environ.get("RANK", "0"))
    warnings.filterwarnings("ignore")
    logging.basicConfig(level=logging.WARNING)
    clock = _EncoderClock()
    host = PluginHost(strict=True)
    host.add_object(clock, name="bench-encoder-clock")
    for job in json.loads(Path(jobs_file).read_text()):
        config = load_config_dict(job["config"], sections=host.registries.config_sections)
        trainer = Trainer(config, host)
        trainer.setup()
        model = trainer.unwrapped_model
        plan = trainer.adapter.parallel_plan(model)
        clock.attach(model.get_submodule(plan.vision_encoder.module), trainer.dist.device)
        trainer.train()
        clock.detach()
        out = Path(config.run.output_dir)
        out.mkdir(parents=True, exist_ok=True)
        (out / f"encoder_ms-rank{rank}.json").write_text(json.dumps(clock.per_step))
        del trainer
    if dist.is_initialized():
        dist.destroy_process_group()


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--worker":
        from hyper_core.parallel.exit import exit_rank

        _worker(sys.argv[2])
        exit_rank(0)  # no interpreter finalisation: see hyper_core.parallel.exit
    else:
        sys.exit("usage: python -m bench encoder_parallel")
