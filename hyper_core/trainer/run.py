"""``hyper-train run``: hold the output directory, write the resolved config, train, print a
summary.

The resolved config goes to ``output_dir/config.toml`` on a first run; a run that resumes from
a checkpoint of step N writes ``config.step-N.toml`` instead, so every config the run's
checkpoints were saved under is kept (see :func:`hyper_core.checkpoint.run_config_for`).
"""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path
from typing import Any

from ..errors import UserError
from ..parallel.env import torchrun_env
from ..run_lock import LOCK_NAME, RunLock
from .trainer import Trainer

log = logging.getLogger("hyper_train")


def prepare_output_dir(out: Path) -> Path | None:
    """Create ``out``; :class:`UserError` when it cannot be a writable directory. Returns the
    outermost directory this call created (``out`` or an ancestor), None if ``out`` existed."""
    if out.exists() and not out.is_dir():
        raise UserError(f"$.run.output_dir: {out} exists and is not a directory")
    created = None
    for parent in (out, *out.parents):
        if parent.exists():
            break
        created = parent
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UserError(f"$.run.output_dir: cannot create {out}: {exc.strerror}") from None
    if not os.access(out, os.W_OK | os.X_OK):
        raise UserError(f"$.run.output_dir: {out} is not writable")
    return created


def _forget_failed_start(out: Path, lock: RunLock, created: Path | None) -> None:
    """After a run that failed before writing anything: no ``output_dir`` holding only its lock
    file. The lock file goes while still held (no other run can be between), then the
    directories this run created, if they are empty."""
    if [p.name for p in out.iterdir()] != [LOCK_NAME]:
        return
    lock.path.unlink(missing_ok=True)
    lock.release()
    if created is None:
        return
    for directory in (out, *out.parents):
        try:
            directory.rmdir()
        except OSError:
            return
        if directory == created:
            return


def run_training(config: Any, host: Any) -> Trainer:
    """Train per ``config`` with the plugins of ``host``; returns the finished trainer.

    The main process (rank 0) holds ``output_dir`` (:class:`RunLock`) from before the model is
    built to the end; another run into it is a :class:`UserError`. A run that fails before
    writing anything there leaves no directory it created (nor its lock file).
    """
    env = torchrun_env()
    lock = None
    out = Path(config.run.output_dir)
    created = None
    if env is None or env["rank"] == 0:
        created = prepare_output_dir(out)
        lock = RunLock(out)
        lock.acquire()
    try:
        return _train(config, host)
    except BaseException:
        if lock is not None:
            _forget_failed_start(out, lock, created)
        raise
    finally:
        if lock is not None:
            lock.release()


def _train(config: Any, host: Any) -> Trainer:
    from ..config import dump_config
    from ..parallel.setup import end_distributed

    trainer = Trainer(config, host)
    out = Path(config.run.output_dir)
    trainer.setup()
    resumed_from = trainer.checkpointer.check_resume(trainer)  # collective
    if trainer.dist.is_main:
        out.mkdir(parents=True, exist_ok=True)
        (out / _config_name(resumed_from)).write_text(dump_config(config))
    trainer.train()
    if trainer.dist.is_main:
        for line in summary_lines(trainer):
            print(f"hyper-train: {line}", file=sys.stderr)
    end_distributed()
    return trainer


def _config_name(resumed_from: Path | None) -> str:
    """``config.toml`` for a first run, ``config.step-N.toml`` for one resumed at step N."""
    if resumed_from is None:
        return "config.toml"
    from ..checkpoint import checkpoint_step

    return f"config.step-{checkpoint_step(resumed_from)}.toml"


def summary_lines(trainer: Trainer) -> list[str]:
    """How the run ended: done, or stopped at step N of M with the checkpoint to resume from;
    then the last evaluation's accuracy, dated when it is older than the last step."""
    state, out = trainer.state, Path(trainer.config.run.output_dir)
    step, total = state.global_step, trainer.train_iters
    skipped = ""
    if state.skipped:
        counts = ", ".join(f"{k}={v}" for k, v in sorted(state.skipped.items()))
        skipped = f"; {counts} samples skipped"
    if not state.stop_requested or step >= total:
        lines = [f"done: {step} steps{skipped}; outputs in {out}"]
    else:
        saved = getattr(trainer.checkpointer, "last_saved_step", None)
        if saved == step:
            ckpt = f"checkpoint saved ({trainer.checkpointer.root / f'step-{step}'})"
        else:
            ckpt = "no checkpoint of this step"
        how = "interrupted" if getattr(trainer, "_stop_signals", 0) else "stopped early"
        if trainer.config.checkpoint.resume == "auto":
            resume = "run the same command to resume"
        else:
            resume = "to resume, run the same command with --checkpoint.resume=auto"
        lines = [f"{how} at step {step}/{total}; {ckpt}; {resume}{skipped}; outputs in {out}"]
    evaluated = trainer.last_eval
    accs = {k: v for k, v in evaluated.items() if k.startswith("accuracy_")}
    if accs:
        when = "" if evaluated.get("step") == step else f" at step {evaluated.get('step')}"
        line = ", ".join(f"{k.removeprefix('accuracy_')} {v:.3f}" for k, v in accs.items())
        lines.append(f"held-out answer accuracy{when}: {line}")
    return lines
