"""The memory profiler's hook implementations (entry point ``memory_profiler``).

Imports neither torch nor transformers: the profiler itself
(:mod:`hyper_memory_profiler.profiler`) is imported by the first hook of a run that enables
``[memory_profiler]``. Each run gets its own :class:`MemoryProfilerRun` (from
``build_callbacks``), which owns that run's :class:`~hyper_memory_profiler.profiler.RunProfiler`.
A failure inside the profiler is logged and recorded in the summary, never raised into the
run.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from hyper_core import hookimpl

SECTION = "memory_profiler"
log = logging.getLogger("hyper_train.memory_profiler")


# -- registration -------------------------------------------------------------------------------


@hookimpl
def register_config_sections(register: Any) -> None:
    """``[memory_profiler]``."""
    register(SECTION, "hyper_memory_profiler.config:MemoryProfilerConfig")


def _add_arguments(parser: Any) -> None:
    from .cli import add_arguments

    add_arguments(parser)


def _run(args: Any) -> int | None:
    from .cli import run

    return run(args)


@hookimpl
def register_commands(register: Any) -> None:
    """``hyper-train memory estimate|report``."""
    register(
        "memory",
        _add_arguments,
        _run,
        help="estimate a config's memory per rank, or print a profiled run's report",
    )


# -- per-run state ------------------------------------------------------------------------------


@hookimpl
def build_callbacks(config: Any, dist: Any) -> MemoryProfilerRun | None:
    """A :class:`MemoryProfilerRun` when ``[memory_profiler] enabled``."""
    cfg = config.section(SECTION)
    if cfg is None or not cfg.enabled:
        return None
    return MemoryProfilerRun(cfg, config, dist)


class MemoryProfilerRun:
    """One run's memory profiler: the lifecycle events of the run, forwarded to its
    :class:`~hyper_memory_profiler.profiler.RunProfiler`, which is created here (right after
    ``setup_distributed``, whose accounting is the first row)."""

    def __init__(self, cfg: Any, config: Any, dist: Any) -> None:
        from .profiler import RunProfiler

        self.profiler = RunProfiler(cfg, config.run.output_dir, dist)
        self._guarded("setup_distributed", self.profiler.distributed_ready)

    def _guarded(self, where: str, fn: Callable[[], None]) -> None:
        try:
            fn()
        except Exception as exc:
            self.profiler.failed(where, exc)

    @hookimpl
    def on_stage_end(self, stage: str, result: Any, trainer: Any) -> None:
        """Account parameters, gradients, optimizer state, buffers and device memory."""
        prof = self.profiler
        self._guarded(f"on_stage_end[{stage}]", lambda: prof.stage_end(stage, result, trainer))

    @hookimpl
    def on_train_begin(self, trainer: Any) -> None:
        """Start the CPU RSS sampler."""
        self._guarded("on_train_begin", lambda: self.profiler.train_begin(trainer))

    @hookimpl
    def on_step_begin(self, trainer: Any, state: Any, micro_batches: list[Any]) -> None:
        """Reset the step peak; on recorded steps start allocator history and activation hooks."""
        step = state.global_step + 1
        self._guarded(
            "on_step_begin", lambda: self.profiler.step_begin(trainer, step, micro_batches)
        )

    @hookimpl
    def on_micro_step_end(self, trainer: Any, state: Any, micro_step: int) -> None:
        """Stop the activation hooks after micro-batch 0."""
        step = state.global_step + 1
        self._guarded(
            "on_micro_step_end", lambda: self.profiler.micro_step_end(trainer, step, micro_step)
        )

    @hookimpl
    def on_step_end(self, trainer: Any, state: Any) -> None:
        """Read the step peak."""
        step = state.global_step
        self._guarded("on_step_end", lambda: self.profiler.step_end(trainer, step))

    @hookimpl
    def on_log(self, trainer: Any, metrics: dict[str, Any]) -> None:
        """Add ``mem/step_peak_mib`` (and friends) to the logged metrics."""
        self._guarded("on_log", lambda: self.profiler.log_metrics(trainer, metrics))

    @hookimpl
    def on_train_end(self, trainer: Any) -> None:
        """Write summary.json, report.md and memory.png."""
        self._guarded("on_train_end", lambda: self.profiler.train_end(trainer))

    @hookimpl
    def on_train_error(self, trainer: Any, exc: BaseException) -> None:
        """Stop recording and write what there is; the run's exception propagates unchanged."""
        try:
            self.profiler.train_error(trainer, exc)
        except Exception:  # never mask the training error
            log.exception("memory profiler: writing the summary after a failed run failed")
