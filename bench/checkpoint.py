"""Checkpoint: save and load time of the tiny and the ~27M model, sync and async."""

from __future__ import annotations

import tempfile
import time

from .overhead import build_trainer
from .runner import Result


def run(size: str = "full") -> Result:
    """Save/load each model ``repeats`` times in each mode."""
    result = Result("checkpoint", "DCP save/load time (model + optimizer + extra state)")
    repeats = 2 if size == "ci" else 5
    sizes = ("tiny",) if size == "ci" else ("tiny", "medium")
    for name in sizes:
        with tempfile.TemporaryDirectory() as tmp:
            trainer = build_trainer(name, tmp, steps=10_000)
            trainer.train_step(next(iter(trainer.dataloaders.train)))  # optimizer state exists
            ckpt = trainer.checkpointer
            for mode in ("sync", "async"):
                ckpt.cfg = type(ckpt.cfg)(**{**_fields(ckpt.cfg), "async_save": mode == "async"})
                for i in range(repeats):
                    trainer.state.global_step = 1000 + i + (100 if mode == "async" else 0)
                    t0 = time.perf_counter()
                    path = ckpt.save(trainer)
                    blocking = time.perf_counter() - t0
                    ckpt.wait()
                    total = time.perf_counter() - t0
                    result.figure(f"{name}_{mode}_save_blocking", "s").values.append(blocking)
                    result.figure(f"{name}_{mode}_save_total", "s").values.append(total)
                    t0 = time.perf_counter()
                    ckpt.load(trainer, path)
                    result.figure(f"{name}_load", "s").values.append(time.perf_counter() - t0)
            trainer._teardown()
    return result


def _fields(obj: object) -> dict:
    import attrs

    return {f.name: getattr(obj, f.name) for f in attrs.fields(type(obj))}
