"""The memory profiler's hook implementations (entry point ``memory_profiler``).

Imports neither torch nor transformers: the profiler itself
(:mod:`hyper_memory_profiler.profiler`) is imported by the first hook of a run that enables
``[memory_profiler]``. Each trainer gets its own :class:`~hyper_memory_profiler.profiler.
RunProfiler`. A failure inside the profiler is logged and recorded in the summary, never
raised into the run.
"""

from __future__ import annotations

import logging
import weakref
from collections.abc import Callable
from typing import Any

from hyper_core import hookimpl

SECTION = "memory_profiler"
log = logging.getLogger("hyper_train.memory_profiler")

_DISABLED = object()
_RUNS: weakref.WeakKeyDictionary[Any, Any] = weakref.WeakKeyDictionary()


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


def _profiler(trainer: Any, dist: Any = None) -> Any:
    """The trainer's profiler; created on the first hook that knows the DistEnv."""
    try:
        prof = _RUNS.get(trainer)
    except TypeError:  # not weak-referenceable: never profiled
        return None
    if prof is None:
        cfg = trainer.config.section(SECTION) if trainer.config is not None else None
        if cfg is None or not cfg.enabled:
            _RUNS[trainer] = _DISABLED
            return None
        dist = dist if dist is not None else getattr(trainer, "dist", None)
        if dist is None:
            return None
        from .profiler import RunProfiler

        prof = RunProfiler(cfg, trainer, dist)
        _RUNS[trainer] = prof
    return None if prof is _DISABLED else prof


def _guarded(prof: Any, where: str, fn: Callable[[], None]) -> None:
    try:
        fn()
    except Exception as exc:
        prof.failed(where, exc)


# -- lifecycle ----------------------------------------------------------------------------------


@hookimpl
def on_stage_end(stage: str, result: Any, trainer: Any) -> None:
    """Account parameters, gradients, optimizer state, buffers and device memory."""
    dist = result if stage == "setup_distributed" else None
    prof = _profiler(trainer, dist)
    if prof is not None:
        _guarded(prof, f"on_stage_end[{stage}]", lambda: prof.stage_end(stage, result, trainer))


@hookimpl
def on_train_begin(trainer: Any, state: Any) -> None:
    """Start the CPU RSS sampler."""
    prof = _profiler(trainer)
    if prof is not None:
        _guarded(prof, "on_train_begin", lambda: prof.train_begin(trainer))


@hookimpl
def on_step_begin(trainer: Any, state: Any, micro_batches: list[Any]) -> None:
    """Reset the step peak; on recorded steps start allocator history and activation hooks."""
    prof = _profiler(trainer)
    if prof is not None:
        step = state.global_step + 1
        _guarded(prof, "on_step_begin", lambda: prof.step_begin(trainer, step, micro_batches))


@hookimpl
def on_micro_step_end(trainer: Any, state: Any, micro_step: int) -> None:
    """Stop the activation hooks after micro-batch 0."""
    prof = _profiler(trainer)
    if prof is not None:
        step = state.global_step + 1
        _guarded(prof, "on_micro_step_end", lambda: prof.micro_step_end(trainer, step, micro_step))


@hookimpl
def on_step_end(trainer: Any, state: Any) -> None:
    """Read the step peak."""
    prof = _profiler(trainer)
    if prof is not None:
        step = state.global_step
        _guarded(prof, "on_step_end", lambda: prof.step_end(trainer, step))


@hookimpl
def on_log(trainer: Any, state: Any, metrics: dict[str, Any]) -> None:
    """Add ``mem/step_peak_mib`` (and friends) to the logged metrics."""
    prof = _profiler(trainer)
    if prof is not None:
        _guarded(prof, "on_log", lambda: prof.log_metrics(trainer, metrics))


@hookimpl
def on_train_end(trainer: Any, state: Any) -> None:
    """Write summary.json, report.md and memory.png."""
    prof = _profiler(trainer)
    if prof is not None:
        _guarded(prof, "on_train_end", lambda: prof.train_end(trainer))


@hookimpl
def on_train_error(trainer: Any, state: Any, exc: BaseException) -> None:
    """Stop recording and write what there is; the run's exception propagates unchanged."""
    prof = _profiler(trainer)
    if prof is None:
        return
    try:
        prof.train_error(trainer, exc)
    except Exception:  # never mask the training error
        log.exception("memory profiler: writing the summary after a failed run failed")
