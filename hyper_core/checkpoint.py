"""Checkpoints with torch.distributed.checkpoint (DCP) and exact resume.

Layout under ``output_dir/checkpoints``::

    step-N/            DCP shards of model + optimizer, extra/rank-R.pt, COMPLETE
    latest             the name of the newest complete checkpoint

A checkpoint is written into ``.tmp-step-N`` and renamed once every rank has finished; the
``COMPLETE`` marker and ``latest`` are written last, so a torn folder is never loaded.
"""

from __future__ import annotations

import logging
import os
import random
import re
import shutil
from pathlib import Path
from typing import Any

from .errors import UserError

log = logging.getLogger("hyper_train")

COMPLETE = "COMPLETE"
_STEP_RE = re.compile(r"^step-(\d+)$")


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
        if (candidate / COMPLETE).is_file():
            return candidate
    complete = complete_checkpoints(root)
    return complete[-1] if complete else None


def _rng_state() -> dict[str, Any]:
    import numpy as np
    import torch

    np_state = np.random.get_state()
    state: dict[str, Any] = {
        "torch": torch.get_rng_state(),
        "python": [*random.getstate()[1], random.getstate()[2]],
        "python_version": random.getstate()[0],
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


def _atomic_write(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


class Checkpointer:
    """Saves every ``[checkpoint] every_steps`` and at the end; resumes per ``resume``."""

    def __init__(self, config: Any, dist: Any) -> None:
        self.config = config
        self.cfg = config.checkpoint
        self.dist = dist
        self.root = Path(config.run.output_dir) / "checkpoints"
        self._pending: Any = None
        self.last_saved_step: int | None = None

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
        }

    # -- save ---------------------------------------------------------------------------------

    def maybe_save(self, trainer: Any, *, final: bool = False) -> None:
        """Save when the step is a multiple of ``every_steps``, or at the end / on a stop."""
        step = trainer.state.global_step
        every = self.cfg.every_steps
        due = bool(every) and step % every == 0
        if (due or final or trainer.state.stop_requested) and step != self.last_saved_step:
            if every is None and not (final or trainer.state.stop_requested):
                return
            self.save(trainer)

    def save(self, trainer: Any) -> Path:
        """Write ``step-N`` (all ranks take part)."""
        import torch
        import torch.distributed.checkpoint as dcp

        self.wait()
        step = trainer.state.global_step
        final_dir = self.root / f"step-{step}"
        tmp_dir = self.root / f".tmp-step-{step}"
        if self.dist.is_main:
            shutil.rmtree(tmp_dir, ignore_errors=True)
            (tmp_dir / "extra").mkdir(parents=True, exist_ok=True)
        self.dist.barrier()
        extra = self._extra_state(trainer)
        torch.save(extra, tmp_dir / "extra" / f"rank-{self.dist.rank}.pt")
        app = self._app_state(trainer)
        if self.cfg.async_save:
            future = dcp.async_save(app, checkpoint_id=str(tmp_dir))
            self._pending = (future, tmp_dir, final_dir, step)
        else:
            dcp.save(app, checkpoint_id=str(tmp_dir))
            self._finish(tmp_dir, final_dir, step)
        self.last_saved_step = step
        return final_dir

    def _finish(self, tmp_dir: Path, final_dir: Path, step: int) -> None:
        self.dist.barrier()
        if self.dist.is_main:
            (tmp_dir / COMPLETE).write_text(f"{step}\n")
            if final_dir.exists():
                shutil.rmtree(final_dir)
            os.replace(tmp_dir, final_dir)
            _atomic_write(self.root / "latest", final_dir.name)
            self._prune()
        self.dist.barrier()

    def wait(self) -> None:
        """Finish a pending asynchronous save."""
        if self._pending is None:
            return
        future, tmp_dir, final_dir, step = self._pending
        self._pending = None
        future.result()
        self._finish(tmp_dir, final_dir, step)

    def _prune(self) -> None:
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
        path = Path(resume)
        if not (path / COMPLETE).is_file():
            raise UserError(f"$.checkpoint.resume: {path} is not a complete checkpoint")
        return path

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

        app = self._app_state(trainer)
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
        if extra.get("world_size") == self.dist.world_size:
            _set_rng_state(extra["rng"])
        trainer.host.fire(
            "on_load_checkpoint",
            trainer=trainer,
            state=trainer.state,
            plugin_state=extra["plugin_state"],
        )
        self.last_saved_step = trainer.state.global_step
        if self.dist.is_main:
            log.info("resumed from %s (step %d)", path, trainer.state.global_step)
