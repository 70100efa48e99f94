"""A test plugin: the full gradient of every parameter at the end of each step's backward.

Registered with ``--plugin ep_probe`` (or ``host.add_module``). On the last micro-step of a
step (before clipping), every rank gathers sharded (FSDP2 DTensor) gradients; rank 0 keeps
``{step: {name: grad}}`` and writes it to ``output_dir/grads.pt`` at the end of the run.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hyper_core import hookimpl


def micro_steps_per_step(trainer: Any) -> int:
    """Micro-batches per rank per step, ``G / (dp × micro)``: the ``cp`` ranks of a group read
    the same micro-batches (``G / (world × micro)`` would snapshot mid-accumulation)."""
    t = trainer.config.training
    return t.global_batch_size // (trainer.dist.dp_size * t.micro_batch_size)


@hookimpl
def on_micro_step_end(trainer: Any, state: Any, micro_step: int, loss: Any) -> None:
    """Snapshot the gradients after the step's last backward."""
    last = micro_steps_per_step(trainer) - 1
    if micro_step > last:  # a snapshot taken before this backward would be a partial sum
        raise AssertionError(f"ep_probe expected {last + 1} micro-steps per step, got more")
    if micro_step != last:
        return
    grads = {}
    for name, param in trainer.unwrapped_model.named_parameters():
        grad = param.grad
        if grad is None:
            continue
        if hasattr(grad, "full_tensor"):
            grad = grad.full_tensor()
        grads[name] = grad.detach().cpu().clone()
    if trainer.dist.is_main:
        store = trainer.__dict__.setdefault("_ep_grads", {})
        store[state.global_step + 1] = grads


@hookimpl
def on_train_end(trainer: Any, state: Any) -> None:
    """Write ``grads.pt`` (rank 0)."""
    import torch

    store = trainer.__dict__.get("_ep_grads")
    if store is not None:
        torch.save(store, Path(trainer.config.run.output_dir) / "grads.pt")
