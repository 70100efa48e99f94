"""Checkpoints with torch.distributed.checkpoint (DCP) and exact resume.

Layout under ``output_dir/checkpoints``::

    step-N/            DCP shards of model + optimizer (.metadata, __R_0.distcp, ...),
                       extra/rank-R.pt (per rank), COMPLETE
    latest             the name of the newest complete checkpoint

What a checkpoint holds: the model and optimizer (DCP, sharded as trained: FSDP2 ranks write
their shards, and DCP reshards on load, so a checkpoint saved on N ranks loads on M), and per
rank ``extra/rank-R.pt``: train state (global step, epoch, counters), LR scheduler, data-loader
position (mid-epoch: epoch and step within it), RNG states (torch, CUDA, python, numpy) and what
plugins put in ``on_save_checkpoint``. RNG states are restored only on the same world size.

Atomicity: a checkpoint is written into ``.tmp-step-N``; once every rank has finished, rank 0
writes ``COMPLETE`` into it, renames it to ``step-N`` and then rewrites ``latest``. Folders
without ``COMPLETE`` (torn by a crash, or still in flight) are never loaded.

``[checkpoint] async = true`` stages the state to CPU memory (a copy, so training may go on)
and writes it from a background thread, whose collectives use a gloo group of their own; the
checkpoint is finalised at the first step after every rank's write has finished (or at the
next save / the end of training).

All ranks must see ``output_dir`` (a shared file system on several nodes).
"""

from __future__ import annotations

import contextlib
import logging
import os
import random
import re
import shutil
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import attrs

from .errors import UserError

log = logging.getLogger("hyper_train")

COMPLETE = "COMPLETE"
_STEP_RE = re.compile(r"^step-(\d+)$")
_TMP_PREFIX = ".tmp-step-"


def complete_checkpoints(root: Path) -> list[Path]:
    """Complete checkpoint folders under ``root``, oldest first."""
    if not root.is_dir():
        return []
    found = []
    for child in root.iterdir():
        m = _STEP_RE.match(child.name)
        if m and (child / COMPLETE).is_file():
            found.append((int(m.group(1)), child))
    return [p for _, p in sorted(found)]


def find_resume_checkpoint(root: Path) -> Path | None:
    """The checkpoint ``resume = "auto"`` loads: ``latest`` if complete, else the newest."""
    latest = root / "latest"
    if latest.is_file():
        candidate = root / latest.read_text().strip()
        if _STEP_RE.match(candidate.name) and (candidate / COMPLETE).is_file():
            return candidate
    complete = complete_checkpoints(root)
    return complete[-1] if complete else None


def resolve_checkpoint(path: str | Path) -> Path:
    """A complete checkpoint folder from a ``step-N`` folder, a ``checkpoints`` folder or a
    run's ``output_dir`` (the latest complete one); :class:`UserError` if there is none."""
    path = Path(path)
    if (path / COMPLETE).is_file():
        return path
    for root in (path, path / "checkpoints"):
        found = find_resume_checkpoint(root)
        if found is not None:
            return found
    raise UserError(f"{path}: not a complete checkpoint (no {COMPLETE} marker), nor a run with one")


_NO_PG_WARNING = r"torch\.distributed is disabled, unavailable or uninitialized"


@contextlib.contextmanager
def _quiet_single_process() -> Iterator[None]:
    """DCP warns on every call without a process group; one process is a supported case."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=_NO_PG_WARNING)
        yield


def _rng_state() -> dict[str, Any]:
    import numpy as np
    import torch

    np_state = np.random.get_state()
    py_state = random.getstate()
    state: dict[str, Any] = {
        "torch": torch.get_rng_state(),
        "python": [*py_state[1], py_state[2]],
        "python_version": py_state[0],
        "numpy": [np_state[0], torch.from_numpy(np_state[1].copy()), *np_state[2:]],
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _set_rng_state(state: dict[str, Any]) -> None:
    import numpy as np
    import torch

    torch.set_rng_state(state["torch"])
    py = state["python"]
    random.setstate((state["python_version"], tuple(py[:-1]), py[-1]))
    kind, keys, *rest = state["numpy"]
    np.random.set_state((kind, keys.numpy(), *rest))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _write_synced(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` atomically and durably (fsync, then rename)."""
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _fsync_dir(path: Path) -> None:
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


@attrs.define
class _Pending:
    future: Any
    tmp_dir: Path
    final_dir: Path
    step: int
    started: float


class Checkpointer:
    """Saves every ``[checkpoint] every_steps`` and at the end (or on a stop); resumes per
    ``resume``. Every method that touches a checkpoint is collective: call it on all ranks."""

    def __init__(self, config: Any, dist: Any) -> None:
        self.config = config
        self.cfg = config.checkpoint
        self.dist = dist
        self.root = Path(config.run.output_dir) / "checkpoints"
        self._pending: _Pending | None = None
        self.last_saved_step: int | None = None
        #: Seconds of the last save (blocking part; async: until staged) and load.
        self.last_save_s: float | None = None
        self.last_load_s: float | None = None
        self._async_group: Any = None
        if self.cfg.async_save and dist.world_size == 1:
            # The background writer thread warns too, outside any catch_warnings().
            warnings.filterwarnings("ignore", message=_NO_PG_WARNING)
        elif self.cfg.async_save:
            import torch.distributed as tdist

            # The background save runs collectives while training runs its own: on the same
            # group their order would differ between ranks (a deadlock). A group of its own.
            self._async_group = tdist.new_group(backend="gloo")

    # -- state --------------------------------------------------------------------------------

    def _app_state(self, trainer: Any) -> dict[str, Any]:
        from torch.distributed.checkpoint.state_dict import get_state_dict

        model_sd, optim_sd = get_state_dict(trainer.model, trainer.optimizer)
        return {"model": model_sd, "optimizer": optim_sd}

    def _extra_state(self, trainer: Any) -> dict[str, Any]:
        plugin_state: dict[str, Any] = {}
        trainer.host.fire(
            "on_save_checkpoint", trainer=trainer, state=trainer.state, plugin_state=plugin_state
        )
        return {
            "train_state": trainer.state.to_dict(),
            "lr_scheduler": trainer.lr_scheduler.state_dict(),
            "dataloader": trainer.dataloaders.train.state_dict(),
            "rng": _rng_state(),
            "plugin_state": plugin_state,
            "world_size": self.dist.world_size,
            "rank": self.dist.rank,
        }

    # -- save ---------------------------------------------------------------------------------

    def maybe_save(self, trainer: Any, *, final: bool = False) -> None:
        """Finalise a finished async save; save when the step is a multiple of
        ``every_steps``, or when ``final`` (end of training or an agreed stop)."""
        self.poll()
        step = trainer.state.global_step
        every = self.cfg.every_steps
        due = bool(every) and step % every == 0
        if (due or final) and step != self.last_saved_step:
            self.save(trainer)

    def save(self, trainer: Any) -> Path:
        """Write ``step-N`` (all ranks take part)."""
        import torch
        import torch.distributed.checkpoint as dcp

        self.wait()
        t0 = time.perf_counter()
        step = trainer.state.global_step
        final_dir = self.root / f"step-{step}"
        tmp_dir = self.root / f"{_TMP_PREFIX}{step}"
        if self.dist.is_main:
            shutil.rmtree(tmp_dir, ignore_errors=True)
            (tmp_dir / "extra").mkdir(parents=True, exist_ok=True)
        self.dist.barrier()
        torch.save(self._extra_state(trainer), tmp_dir / "extra" / f"rank-{self.dist.rank}.pt")
        app = self._app_state(trainer)
        with _quiet_single_process():
            if self.cfg.async_save:
                future = dcp.async_save(
                    app, checkpoint_id=str(tmp_dir), process_group=self._async_group
                )
                self._pending = _Pending(
                    future=future, tmp_dir=tmp_dir, final_dir=final_dir, step=step, started=t0
                )
            else:
                dcp.save(app, checkpoint_id=str(tmp_dir))
        self.last_save_s = time.perf_counter() - t0
        self.last_saved_step = step
        if self._pending is None:
            self._finish(tmp_dir, final_dir, step, t0)
        elif self.dist.is_main:
            log.info(
                "checkpoint step-%d staged in %.2f s; writing in the background",
                step,
                self.last_save_s,
            )
        return final_dir

    def _finish(self, tmp_dir: Path, final_dir: Path, step: int, t0: float) -> None:
        self.dist.barrier()  # every rank's shards and extra state are on disk
        if self.dist.is_main:
            _write_synced(tmp_dir / COMPLETE, f"{step}\n")
            if final_dir.exists():
                shutil.rmtree(final_dir)
            os.replace(tmp_dir, final_dir)
            _fsync_dir(self.root)
            _write_synced(self.root / "latest", final_dir.name)
            self._prune()
            log.info("saved checkpoint %s in %.2f s", final_dir, time.perf_counter() - t0)
        self.dist.barrier()

    def poll(self) -> None:
        """Finalise a pending async save once every rank's write has finished (collective)."""
        if self._pending is None:
            return
        if self.dist.any_true(not self._pending.future.done()):
            return
        self.wait()

    def wait(self) -> None:
        """Finish a pending asynchronous save (blocks until written; collective)."""
        if self._pending is None:
            return
        pending, self._pending = self._pending, None
        pending.future.result()
        self._finish(pending.tmp_dir, pending.final_dir, pending.step, pending.started)

    def _prune(self) -> None:
        for tmp in self.root.glob(f"{_TMP_PREFIX}*"):
            if self._pending is None or tmp != self._pending.tmp_dir:
                shutil.rmtree(tmp, ignore_errors=True)
        keep = self.cfg.keep_last
        if not keep:
            return
        for old in complete_checkpoints(self.root)[:-keep]:
            shutil.rmtree(old, ignore_errors=True)

    # -- load ---------------------------------------------------------------------------------

    def resume_path(self) -> Path | None:
        """The checkpoint to resume from, per ``[checkpoint] resume``."""
        resume = self.cfg.resume
        if resume == "none":
            return None
        if resume == "auto":
            return find_resume_checkpoint(self.root)
        try:
            return resolve_checkpoint(resume)
        except UserError as exc:
            raise UserError(f"$.checkpoint.resume: {exc}") from None

    def maybe_resume(self, trainer: Any) -> Path | None:
        """Load the checkpoint chosen by :meth:`resume_path`, if any."""
        path = self.resume_path()
        if path is None:
            return None
        self.load(trainer, path)
        return path

    def load(self, trainer: Any, path: Path) -> None:
        """Restore model, optimizer, scheduler, data position, RNG and plugin state."""
        import torch
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import set_state_dict

        t0 = time.perf_counter()
        app = self._app_state(trainer)
        with _quiet_single_process():
            dcp.load(app, checkpoint_id=str(path))
        set_state_dict(
            trainer.model,
            trainer.optimizer,
            model_state_dict=app["model"],
            optim_state_dict=app["optimizer"],
        )
        extra_file = path / "extra" / f"rank-{self.dist.rank}.pt"
        if not extra_file.is_file():
            extra_file = path / "extra" / "rank-0.pt"
        extra = torch.load(extra_file, weights_only=True)
        trainer.state.load_dict(extra["train_state"])
        trainer.lr_scheduler.load_state_dict(extra["lr_scheduler"])
        trainer.dataloaders.train.load_state_dict(extra["dataloader"])
        saved_world = extra.get("world_size")
        if saved_world == self.dist.world_size:
            _set_rng_state(extra["rng"])
        elif self.dist.is_main:
            log.info(
                "checkpoint saved on %s ranks, resuming on %d: RNG streams start from the seed",
                saved_world,
                self.dist.world_size,
            )
        trainer.host.fire(
            "on_load_checkpoint",
            trainer=trainer,
            state=trainer.state,
            plugin_state=extra["plugin_state"],
        )
        self.last_saved_step = trainer.state.global_step
        self.last_load_s = time.perf_counter() - t0
        if self.dist.is_main:
            log.info(
                "resumed from %s (step %d) in %.2f s",
                path,
                trainer.state.global_step,
                self.last_load_s,
            )
