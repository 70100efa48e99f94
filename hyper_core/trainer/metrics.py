"""Throughput accounting between log lines and the ``metrics.jsonl`` writer."""

from __future__ import annotations

import json
import logging
import math
import os
import resource
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import UserError
from ..parallel.rank_output import RELAYED_TTY_ENV

if TYPE_CHECKING:
    from ..plugins.manager import PluginHost

log = logging.getLogger("hyper_train")


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

    def __init__(self, peak_flops: float | None = None) -> None:
        #: The device's peak FLOP/s in the run's compute dtype (MFU), when known.
        self.peak_flops = peak_flops
        self._reset()

    def _reset(self) -> None:
        self.t0 = time.perf_counter()
        self.wait = 0.0
        self.steps = 0
        self.tokens = 0
        self.padding = 0
        self.flops = 0.0
        self.hardware_flops = 0.0
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
        self.hardware_flops += float(stats.get("hardware_flops", stats["flops"]))

    def flush(self, dist: Any) -> dict[str, Any]:
        """Metrics since the last flush (global over ranks), then reset."""
        import torch

        elapsed = max(time.perf_counter() - self.t0, 1e-9)
        totals = torch.tensor(
            [self.tokens, self.padding, self.flops, self.hardware_flops], dtype=torch.float64
        )
        if dist.world_size > 1:
            totals = dist.all_reduce_sum(totals.to(dist.device)).cpu()
        tokens, padding, flops, hardware = (float(x) for x in totals)
        out: dict[str, Any] = {
            "tokens_per_s": tokens / elapsed,
            "padding_ratio": padding / (tokens + padding) if tokens + padding else 0.0,
            "step_time_s": elapsed / max(self.steps, 1),
            "data_wait_frac": self.wait / elapsed,
        }
        if self.peak_flops and flops:
            peak = self.peak_flops * dist.world_size
            out["mfu"] = flops / elapsed / peak
            # recomputation included: the device's real work rate
            out["hfu"] = hardware / elapsed / peak
        out.update(memory_metrics(dist.device))
        self._reset()
        return out


def fire_tracking_keys(
    host: PluginHost, event: str, metrics: dict[str, Any], **kwargs: Any
) -> dict[str, str]:
    """Fire ``event`` (``on_log``, ``on_evaluate``) with ``metrics``; returns, for each key an
    implementation added or replaced, the name of the plugin that set it last.

    The implementations run one by one, in pluggy's order and through its hook execution (so
    ``--trace-hooks`` monitors each). With a hook wrapper among them the hook runs once as
    usual, and changed keys are put down to all its plugins together.
    """
    caller = getattr(host.pm.hook, event)
    impls = caller.get_hookimpls()
    call_kwargs = {**kwargs, "metrics": metrics}
    if any(impl.wrapper or impl.hookwrapper for impl in impls):
        before = dict(metrics)
        caller(**call_kwargs)
        names = " or ".join(sorted({impl.plugin_name for impl in impls}))
        return dict.fromkeys(_changed_keys(before, metrics), names)
    added_by: dict[str, str] = {}
    for impl in reversed(impls):  # pluggy calls the last registered first
        before = dict(metrics)
        # pluggy's own subset callers would need hashable plugin objects.
        host.pm._hookexec(event, [impl], call_kwargs, False)
        added_by.update(dict.fromkeys(_changed_keys(before, metrics), impl.plugin_name))
    return added_by


def _changed_keys(before: dict[str, Any], after: dict[str, Any]) -> list[str]:
    return [k for k, v in after.items() if k not in before or before[k] is not v]


class _Unloggable(Exception):
    """A metric value with no JSON form; the message describes it."""


def _plain(value: Any) -> Any:
    """``value`` as JSON-able Python values: 0-d tensors and numpy scalars or 0-d arrays become
    numbers; :class:`_Unloggable` for anything else that JSON cannot hold."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, dict):
        return {_plain_key(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    shape = getattr(value, "shape", None)
    if getattr(value, "ndim", None) == 0 and callable(getattr(value, "item", None)):
        item = value.item()  # a 0-d tensor, numpy scalar or 0-d array
        if isinstance(item, (bool, int, float)):
            return item
    elif shape is not None:
        raise _Unloggable(f"a {type(value).__name__} of shape {tuple(shape)}")
    raise _Unloggable(f"a {type(value).__name__}")


def _plain_key(key: Any) -> Any:
    if key is None or isinstance(key, (bool, int, float, str)):
        return key
    raise _Unloggable(f"a table with a {type(key).__name__} key")


def _for_json(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {k: _for_json(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_for_json(v) for v in value]
    return value


class MetricsWriter:
    """Appends one JSON object per logged step to ``output_dir/metrics.jsonl`` (rank 0).

    Values are made JSON-able first (see :func:`_plain`); a value that cannot be is dropped,
    with one warning per key naming the plugin that added it (``added_by``).
    """

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
        self._warned: set[str] = set()

    def _clean(
        self, metrics: dict[str, Any], added_by: dict[str, str], prefix: str = ""
    ) -> dict[str, Any]:
        """``metrics`` without the values :func:`_plain` rejects (each warned about once)."""
        out: dict[str, Any] = {}
        for key, value in metrics.items():
            name = f"{prefix}{key}"
            try:
                if isinstance(value, dict) and isinstance(key, str):
                    out[key] = self._clean(value, added_by, f"{name}.")
                else:
                    out[_plain_key(key)] = _plain(value)
            except _Unloggable as exc:
                if name not in self._warned:
                    self._warned.add(name)
                    source = f"plugin {added_by[name]!r}" if name in added_by else "the trainer"
                    log.warning(
                        "metric %r (added by %s) is %s, not a number or JSON value: not logged",
                        name,
                        source,
                        exc,
                    )
        return out

    def write(self, metrics: dict[str, Any], *, added_by: dict[str, str] | None = None) -> None:
        """Write one record (and TensorBoard scalars); ``added_by``: dotted key → plugin."""
        metrics = self._clean(metrics, added_by or {})
        self._file.write(json.dumps(_for_json(metrics), sort_keys=True) + "\n")
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

    def write_text(self, tag: str, text: str, step: int) -> None:
        """A TensorBoard text entry (nothing without TensorBoard)."""
        if self._tb is not None:
            self._tb.add_text(tag, text, step)

    def close(self) -> None:
        """Flush and close."""
        self._file.close()
        if self._tb is not None:
            self._tb.close()


def is_interactive() -> bool:
    """Whether stderr is a terminal, or was before the launcher relayed it (and not CI)."""
    tty = sys.stderr.isatty() or os.environ.get(RELAYED_TTY_ENV) == "1"
    return tty and not os.environ.get("CI")
