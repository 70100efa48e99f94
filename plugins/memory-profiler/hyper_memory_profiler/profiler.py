"""One run's memory profile: what the plugin's hooks record, and writing it out."""

from __future__ import annotations

import logging
import traceback
from pathlib import Path
from typing import Any

import torch

from .accounting import GroupMap, account, device_memory
from .activations import SavedTensorMeter
from .config import MemoryProfilerConfig
from .estimate import BatchShape
from .peaks import StepPeaks

log = logging.getLogger("hyper_train.memory_profiler")

SUMMARY_VERSION = 1
#: Per-step peaks kept in the summary (a long run keeps its first ones).
MAX_STEP_PEAKS = 100_000


def output_dir(run_output_dir: str | Path, cfg: MemoryProfilerConfig) -> Path:
    """``[memory_profiler] output_dir`` resolved against ``[run] output_dir``."""
    path = Path(cfg.output_dir).expanduser()
    return path if path.is_absolute() else Path(run_output_dir) / path


class RunProfiler:
    """Records stage accounting, step peaks, activations and CUDA history for one run."""

    def __init__(self, cfg: MemoryProfilerConfig, run_output_dir: str | Path, dist: Any) -> None:
        self.cfg = cfg
        self.selection = cfg.selection
        self.rank = int(getattr(dist, "rank", 0))
        self.world_size = int(getattr(dist, "world_size", 1))
        self.device = getattr(dist, "device", None)
        self.cuda = self.device is not None and self.device.type == "cuda"
        self.out_dir = output_dir(run_output_dir, cfg)
        self.groups = GroupMap({"language": [""]})
        self.group_source = "default"
        self.stages: list[dict[str, Any]] = []
        self.steps: list[dict[str, Any]] = []
        self.step_peaks: list[list[int]] = []
        self.window: list[dict[str, int]] = []
        self.peak_since_start = 0
        self.peaks = StepPeaks(self.device, cfg.sample_interval_ms)
        self.meter = SavedTensorMeter() if cfg.activations else None
        self.errors: list[str] = []
        self.current: dict[str, Any] | None = None
        self.detail_rows_step: int | None = None  # the step whose state rows are recorded
        self.train_iters = 0
        self.recording = False
        self.snapshot: str | None = None
        self.finished = False

    # -- helpers --------------------------------------------------------------------------------

    def failed(self, where: str, exc: BaseException) -> None:
        """A profiler bug never stops the run: log it and keep it for the summary."""
        text = f"{where}: {type(exc).__name__}: {exc}"
        self.errors.append(text)
        log.warning("memory profiler: %s\n%s", text, traceback.format_exc())

    def _unwrap(self, trainer: Any, model: Any) -> Any:
        strategy = getattr(trainer, "strategy", None)
        return strategy.unwrap(model) if strategy is not None and model is not None else model

    def _row(self, label: str, model: Any, optimizer: Any, **extra: Any) -> dict[str, Any]:
        row: dict[str, Any] = {"stage": label, **extra}
        row.update(account(model, optimizer, self.groups))
        row["device"] = device_memory(self.device)
        return row

    def _last_step(self) -> int | None:
        last = self.selection.last
        return last if last is not None else (self.train_iters or None)

    # -- build stages ---------------------------------------------------------------------------

    def distributed_ready(self) -> None:
        """The ``setup_distributed`` row: nothing built yet but the process group."""
        self.stages.append(self._row("setup_distributed", None, None))

    def stage_end(self, stage: str, result: Any, trainer: Any) -> None:
        """Account the objects built so far (the stage's own result is not yet on trainer)."""
        model = result if stage in ("build_model", "parallelize_model") else trainer.model
        model = self._unwrap(trainer, model)
        optimizer = result if stage == "build_optimizer" else trainer.optimizer
        if stage == "build_model" and trainer.adapter is not None:
            try:
                self.groups = GroupMap(trainer.adapter.freeze_groups(model))
                self.group_source = "adapter.freeze_groups"
            except Exception as exc:  # an adapter without groups: all "language"
                log.debug("memory profiler: freeze_groups failed: %s", exc)
        self.stages.append(self._row(stage, model, optimizer))

    # -- steps ----------------------------------------------------------------------------------

    def train_begin(self, trainer: Any) -> None:
        """Start the RSS sampler; note the run's length (for ``steps = "all"``)."""
        self.train_iters = int(getattr(trainer, "train_iters", 0) or 0)
        self.peaks.start()
        if self.cfg.snapshots and not self.cuda and self.rank == 0:
            log.info(
                "memory profiler: CUDA allocator snapshots need a CUDA device; "
                "this run is on %s, so none are written",
                self.device.type if self.device is not None else "cpu",
            )

    def step_begin(self, trainer: Any, step: int, micro_batches: list[Any]) -> None:
        """Reset the step peak; for a recorded step, start history and activation hooks."""
        self.peaks.begin()
        if step not in self.selection:
            self.current = None
            return
        self.current = {"step": step, "micro_batches": len(micro_batches)}
        if micro_batches:
            model = self._unwrap(trainer, trainer.model)
            batch = BatchShape.from_micro_batch(micro_batches[0], trainer.adapter, model)
            self.current["batch"] = batch.__dict__
        if self.detail_rows_step is None:
            self.detail_rows_step = step
        if self.cuda and self.cfg.snapshots and not self.recording:
            torch.cuda.memory._record_memory_history(max_entries=self.cfg.max_entries)
            self.recording = True
        if self.meter is not None and micro_batches:
            self.meter.start()

    def micro_step_end(self, trainer: Any, step: int, micro_step: int) -> None:
        """Activation hooks off after micro-batch 0; gradient rows of the first recorded step."""
        if self.meter is not None and self.meter.active:
            measured = self.meter.stop()
            if self.current is not None:
                self.current.update(measured)
        if self.current is not None and step == self.detail_rows_step:
            row = self._row(
                f"step {step}: after backward",
                self._unwrap(trainer, trainer.model),
                trainer.optimizer,
                step=step,
                micro_step=micro_step,
            )
            if self.stages and self.stages[-1].get("stage") == row["stage"]:
                self.stages[-1] = row  # keep the last micro-step's (all gradients)
            else:
                self.stages.append(row)

    def step_end(self, trainer: Any, step: int) -> None:
        """Read the step peak; finish the step's record; dump the snapshot after the last."""
        if self.meter is not None and self.meter.active:
            measured = self.meter.stop()
            if self.current is not None:
                self.current.update(measured)
        peak = self.peaks.end()
        self.peak_since_start = max(self.peak_since_start, peak["peak"])
        if len(self.step_peaks) < MAX_STEP_PEAKS:
            self.step_peaks.append([step, peak["peak"], peak["delta"]])
        window = dict(peak)
        if self.current is not None:
            self.current.update(peak)
            if "activations" in self.current:
                window["activations"] = self.current["activations"]
            self.steps.append(self.current)
            if step == self.detail_rows_step:
                self.stages.append(
                    self._row(
                        f"step {step}: after optimizer step",
                        self._unwrap(trainer, trainer.model),
                        trainer.optimizer,
                        step=step,
                    )
                )
        self.window.append(window)
        self.current = None
        last = self._last_step()
        if self.recording and last is not None and step >= last:
            self.dump_snapshot()

    def log_metrics(self, trainer: Any, metrics: dict[str, Any]) -> None:
        """``mem/*`` keys: the largest step peak (and growth) since the last log line.

        With several ranks the figures are the maximum over ranks (an all-reduce; ``on_log``
        runs on every rank at the same step).
        """
        window, self.window = self.window, []
        if not window:
            return
        peak = max(w["peak"] for w in window)
        delta = max(w["delta"] for w in window)
        acts = max((w["activations"] for w in window if "activations" in w), default=-1)
        values = [float(peak), float(delta), float(acts), float(self.peak_since_start)]
        if self.world_size > 1 and torch.distributed.is_initialized():
            t = torch.tensor(values, dtype=torch.float64, device=self.device)
            torch.distributed.all_reduce(t, op=torch.distributed.ReduceOp.MAX)
            values = t.tolist()
        mib = 2.0**20
        metrics["mem/step_peak_mib"] = values[0] / mib
        metrics["mem/step_peak_delta_mib"] = values[1] / mib
        metrics["mem/peak_mib"] = values[3] / mib
        if values[2] >= 0:
            metrics["mem/activations_mib"] = values[2] / mib
        if self.cuda:
            metrics["mem/step_peak_reserved_mib"] = (
                max(w.get("peak_reserved", 0) for w in window) / mib
            )

    # -- snapshots ------------------------------------------------------------------------------

    def dump_snapshot(self) -> None:
        """Write this rank's allocator snapshot and stop recording."""
        if not self.recording:
            return
        self.recording = False
        path = self.out_dir / f"snapshot_rank{self.rank}.pickle"
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            torch.cuda.memory._dump_snapshot(str(path))
            self.snapshot = str(path)
        finally:
            torch.cuda.memory._record_memory_history(enabled=None)

    # -- the end --------------------------------------------------------------------------------

    def record(self) -> dict[str, Any]:
        """This rank's part of the summary."""
        return {
            "rank": self.rank,
            "device": str(self.device) if self.device is not None else "cpu",
            "peak_method": self.peaks.method,
            "groups": self.groups.groups,
            "group_source": self.group_source,
            "stages": self.stages,
            "steps": self.steps,
            "step_peaks": self.step_peaks,
            "peak_since_start": self.peak_since_start,
            "snapshot": self.snapshot,
            "errors": list(self.errors),
        }

    def close(self) -> None:
        """Stop what runs in the background (hooks, sampler, allocator history)."""
        if self.meter is not None and self.meter.active:
            self.meter.stop()
        self.peaks.close()
        if self.recording:
            try:
                self.dump_snapshot()
            except Exception as exc:
                self.failed("dump_snapshot", exc)

    def train_end(self, trainer: Any) -> None:
        """Gather every rank's record; rank 0 writes summary, report and plot."""
        self.close()
        records = [self.record()]
        if self.world_size > 1 and torch.distributed.is_initialized():
            gathered: list[Any] = [None] * self.world_size
            torch.distributed.all_gather_object(gathered, records[0])
            records = gathered
        if self.rank != 0:
            self.finished = True
            return
        summary = self.summary(trainer, records, status="completed")
        if self.cfg.compare_estimate:
            try:
                self.add_estimate(trainer, summary)
            except Exception as exc:
                self.failed("compare_estimate", exc)
                summary["ranks"][0]["errors"] = list(self.errors)
        self.write(summary)
        self.finished = True

    def train_error(self, trainer: Any, exc: BaseException) -> None:
        """Stop recording, dump what there is, write this rank's summary; no collectives."""
        if self.finished:
            return
        self.close()
        summary = self.summary(trainer, [self.record()], status="failed")
        summary["error"] = f"{type(exc).__name__}: {exc}"
        name = "summary.json" if self.rank == 0 else f"summary.rank{self.rank}.json"
        self.write(summary, name=name, full=self.rank == 0)
        self.finished = True

    def summary(self, trainer: Any, records: list[dict[str, Any]], status: str) -> dict[str, Any]:
        """The summary.json content (bytes throughout)."""
        cfg = trainer.config
        dist = trainer.dist
        return {
            "version": SUMMARY_VERSION,
            "status": status,
            "error": None,
            "units": "bytes",
            "run": {
                "output_dir": str(cfg.run.output_dir),
                "adapter": getattr(trainer.adapter, "name", None),
                "device": str(self.device) if self.device is not None else "cpu",
                "world_size": self.world_size,
                "strategy": cfg.parallel.strategy,
                "dp_shard": int(getattr(dist, "dp_shard", 1)),
                "dp_replicate": int(getattr(dist, "dp_replicate", 1)),
                "model_dtype": cfg.model.dtype,
                "mixed_precision": cfg.training.mixed_precision,
                "activation_checkpointing": cfg.training.activation_checkpointing,
                "vision_activation_checkpointing": cfg.training.vision_activation_checkpointing
                or cfg.training.activation_checkpointing,
                "attn_implementation": cfg.model.attn_implementation,
                "micro_batch_size": cfg.training.micro_batch_size,
                "steps_recorded": self.cfg.steps,
            },
            "peak_method": self.peaks.method,
            "ranks": records,
            "estimate": None,
            "comparison": None,
        }

    def add_estimate(self, trainer: Any, summary: dict[str, Any]) -> None:
        """The estimate for this run's layout and measured micro-batch, and the comparison."""
        from .estimate import Layout, build_meta_model, estimate_model
        from .report import comparison

        dist = trainer.dist
        measured = next((s for s in self.steps if "batch" in s), None)
        batch = BatchShape(**measured["batch"]) if measured is not None else None
        layout = Layout(
            world_size=self.world_size,
            dp_replicate=int(getattr(dist, "dp_replicate", 1)),
            dp_shard=int(getattr(dist, "dp_shard", 1)),
            strategy=trainer.config.parallel.strategy,
            shards_parameters=bool(getattr(trainer.strategy, "shards_parameters", False)),
            ep=int(getattr(dist, "ep", 1)),
            cp=int(getattr(dist, "cp", 1)),
        )
        model = build_meta_model(trainer.config, trainer.adapter)
        counted = batch is not None and batch.label_tokens is not None
        est = estimate_model(
            model,
            trainer.adapter,
            trainer.config,
            layout,
            batch,
            self.rank,
            label_source="micro-batch" if counted else "default",
        )
        summary["estimate"] = est.to_json()
        summary["comparison"] = comparison(summary)

    def write(self, summary: dict[str, Any], name: str = "summary.json", full: bool = True) -> None:
        """summary.json (+ report.md and memory.png when ``full``)."""
        from .report import write_outputs

        write_outputs(summary, self.out_dir, name=name, full=full, plot=self.cfg.plot)
