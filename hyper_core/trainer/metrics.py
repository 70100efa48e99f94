"""Throughput accounting between log lines and the ``metrics.jsonl`` writer."""

from __future__ import annotations

import json
import math
import os
import resource
import sys
import time
from pathlib import Path
from typing import Any

from ..errors import UserError

#: Dense bf16 peak FLOP/s by device name fragment, for MFU.
PEAK_FLOPS: dict[str, float] = {
    "H200": 989e12,
    "H100": 989e12,
    "A100": 312e12,
    "L40S": 362e12,
    "A10G": 125e12,
}


def device_peak_flops(device: Any) -> float | None:
    """The bf16 dense peak of a CUDA device, when known."""
    if device is None or getattr(device, "type", "cpu") != "cuda":
        return None
    import torch

    name = torch.cuda.get_device_name(device)
    for key, peak in PEAK_FLOPS.items():
        if key in name:
            return peak
    return None


def memory_metrics(device: Any) -> dict[str, float]:
    """Device memory (CUDA) or the process's peak RSS (CPU), in MiB."""
    if device is not None and getattr(device, "type", "cpu") == "cuda":
        import torch

        return {
            "mem_allocated_mib": torch.cuda.memory_allocated(device) / 2**20,
            "mem_peak_mib": torch.cuda.max_memory_allocated(device) / 2**20,
        }
    rss_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {"mem_peak_rss_mib": rss_kib / 1024}


class StepTimer:
    """Accumulates step statistics between two log lines."""

    def __init__(self) -> None:
        self._reset()

    def _reset(self) -> None:
        self.t0 = time.perf_counter()
        self.wait = 0.0
        self.steps = 0
        self.tokens = 0
        self.padding = 0
        self.flops = 0.0
        self._wait_start = 0.0

    def start_wait(self) -> None:
        """The trainer starts waiting for data."""
        self._wait_start = time.perf_counter()

    def end_wait(self) -> None:
        """Data arrived."""
        self.wait += time.perf_counter() - self._wait_start

    def add_step(self, stats: dict[str, Any]) -> None:
        """Add a finished step."""
        self.steps += 1
        self.tokens += int(stats["tokens"])
        self.padding += int(stats["padding"])
        self.flops += float(stats["flops"])

    def flush(self, dist: Any) -> dict[str, Any]:
        """Metrics since the last flush (global over ranks), then reset."""
        import torch

        elapsed = max(time.perf_counter() - self.t0, 1e-9)
        totals = torch.tensor([self.tokens, self.padding, self.flops], dtype=torch.float64)
        if dist.world_size > 1:
            totals = dist.all_reduce_sum(totals.to(dist.device)).cpu()
        tokens, padding, flops = (float(x) for x in totals)
        out: dict[str, Any] = {
            "tokens_per_s": tokens / elapsed,
            "padding_ratio": padding / (tokens + padding) if tokens + padding else 0.0,
            "step_time_s": elapsed / max(self.steps, 1),
            "data_wait_frac": self.wait / elapsed,
        }
        peak = device_peak_flops(dist.device)
        if peak and flops:
            out["mfu"] = flops / elapsed / (peak * dist.world_size)
        out.update(memory_metrics(dist.device))
        self._reset()
        return out


def _clean(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    return value


class MetricsWriter:
    """Appends one JSON object per logged step to ``output_dir/metrics.jsonl`` (rank 0)."""

    def __init__(self, output_dir: str | os.PathLike[str], *, tensorboard: bool = False) -> None:
        self.path = Path(output_dir) / "metrics.jsonl"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file = self.path.open("a", encoding="utf-8")
        self._tb = None
        if tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError as exc:
                raise UserError(
                    "$.logging.tensorboard: tensorboard is not installed; "
                    "pip install 'hyper-train[tensorboard]'"
                ) from exc
            self._tb = SummaryWriter(str(Path(output_dir) / "tensorboard"))

    def write(self, metrics: dict[str, Any]) -> None:
        """Write one record (and TensorBoard scalars)."""
        self._file.write(json.dumps(_clean(metrics), sort_keys=True) + "\n")
        self._file.flush()
        if self._tb is not None:
            step = int(metrics.get("step", 0))
            flat = metrics.get("eval", metrics)
            prefix = "eval/" if "eval" in metrics else "train/"
            for key, value in flat.items():
                if (
                    isinstance(value, (int, float))
                    and not isinstance(value, bool)
                    and key != "step"
                ):
                    self._tb.add_scalar(prefix + key, value, step)

    def close(self) -> None:
        """Flush and close."""
        self._file.close()
        if self._tb is not None:
            self._tb.close()


def is_interactive() -> bool:
    """Whether stderr is a terminal (and not CI)."""
    return sys.stderr.isatty() and not os.environ.get("CI")
