"""A test plugin: the host syncs per training step on this rank that a CUDA run would make.

It counts ``Tensor.item``/``tolist``/``float``/``int``/``bool`` called from ``hyper_core`` or
``hyper_encoder_parallel`` between ``on_step_begin`` and ``on_step_end``, as
``tests/core/test_host_syncs.py`` does, but only on tensors a CUDA run would hold on the
device. On CPU every tensor is on the host, so it tells them apart:

* the run's ``get_batch`` gives the model copies of the micro-batch's tensors (on CPU ``.to``
  would give the same objects), like a CUDA run's device copies;
* :class:`HostMarks`, a torch function mode, marks as host-side the micro-batch's own tensors
  (the collate's) and whatever is computed from host-side tensors alone. Everything else (the
  device copies, parameters, new tensors, what is computed from them) counts as device-side.

At the end of the run each rank writes ``syncs-rank<R>.json``: per step, the count, this rank's
micro-batches with images and its images, and the callers.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Generator, Mapping
from pathlib import Path
from typing import Any

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_leaves

from hyper_core import hookimpl

NAMES = ("item", "tolist", "__float__", "__int__", "__bool__")
COUNTED = ("hyper_core", "hyper_encoder_parallel")
HOST = "_ep_syncs_host"


def is_host(tensor: torch.Tensor) -> bool:
    """Whether ``tensor`` is host-side (see :class:`HostMarks`)."""
    return bool(getattr(tensor, HOST, False))


def mark_host(values: Mapping[str, Any]) -> None:
    """Mark the tensors of ``values`` (a micro-batch's, still on the host) host-side."""
    for value in values.values():
        if isinstance(value, torch.Tensor):
            setattr(value, HOST, True)


class HostMarks(TorchFunctionMode):
    """Marks the results of every torch call: host-side when all its tensor inputs are."""

    def __torch_function__(
        self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: Any = None
    ) -> Any:
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        inputs = [t for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
        host = bool(inputs) and all(is_host(t) for t in inputs)
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor):
                setattr(t, HOST, host)
        return out


def device_copies(get_batch: Any) -> Any:
    """``get_batch`` whose tensors are copies of the micro-batch's, as on a CUDA run (the
    micro-batch's own are marked host-side)."""

    def get_batch_with_copies(micro_batch: Any) -> tuple[dict[str, Any], dict[str, Any]]:
        mark_host(micro_batch.model_inputs)
        mark_host(micro_batch.loss_inputs)
        model_inputs, loss_inputs = get_batch(micro_batch)
        copies: dict[int, torch.Tensor] = {}

        def copy(value: Any) -> Any:
            if not isinstance(value, torch.Tensor):
                return value
            if id(value) not in copies:  # a tensor given twice stays one tensor
                copies[id(value)] = value.clone()
                setattr(copies[id(value)], HOST, False)
            return copies[id(value)]

        return (
            {k: copy(v) for k, v in model_inputs.items()},
            {k: copy(v) for k, v in loss_inputs.items()},
        )

    return get_batch_with_copies


class SyncCounter:
    """Counts the syncs on device-side tensors from :data:`COUNTED` while :attr:`on`."""

    def __init__(self) -> None:
        self.on = False
        self.callers: list[str] = []
        self.steps: list[dict[str, Any]] = []
        self.real = {name: getattr(torch.Tensor, name) for name in NAMES}
        self.mode: HostMarks | None = None

    def patch(self) -> None:
        for name, real in self.real.items():

            def counted(tensor: Any, *args: Any, _real: Any = real, **kwargs: Any) -> Any:
                frame = sys._getframe(1)
                caller = frame.f_globals.get("__name__", "")
                if self.on and caller.startswith(COUNTED) and not is_host(tensor):
                    self.callers.append(f"{caller}:{frame.f_lineno}")
                return _real(tensor, *args, **kwargs)

            setattr(torch.Tensor, name, counted)

    def unpatch(self) -> None:
        for name, real in self.real.items():
            setattr(torch.Tensor, name, real)

    def start(self) -> None:
        """Count from now on, marking host-side tensors."""
        self.callers, self.on = [], True
        self.mode = HostMarks()
        self.mode.__enter__()

    def stop(self) -> None:
        """Stop counting."""
        self.on = False
        if self.mode is not None:
            self.mode.__exit__(None, None, None)
            self.mode = None


def _counter(trainer: Any) -> SyncCounter:
    return trainer.__dict__["_ep_syncs"]


@hookimpl(wrapper=True, trylast=True)
def build_get_batch() -> Generator[None, Any, Any]:
    """The run's ``get_batch`` with device copies (innermost: what other plugins wrap)."""
    get_batch = yield
    return device_copies(get_batch)


@hookimpl
def on_train_begin(trainer: Any, state: Any) -> None:
    counter = trainer.__dict__["_ep_syncs"] = SyncCounter()
    counter.patch()


@hookimpl
def on_step_begin(trainer: Any, state: Any, micro_batches: list[Any]) -> None:
    counter = _counter(trainer)
    counter.steps.append(
        {
            "micro_batches_with_images": sum(1 for mb in micro_batches if mb.num_images),
            "images": sum(mb.num_images for mb in micro_batches),
        }
    )
    counter.start()


@hookimpl
def on_step_end(trainer: Any, state: Any, loss: Any, loss_dict: Any, grad_norm: Any) -> None:
    counter = _counter(trainer)
    counter.stop()
    counter.steps[-1].update(syncs=len(counter.callers), callers=counter.callers)


@hookimpl
def on_train_end(trainer: Any, state: Any) -> None:
    counter = _counter(trainer)
    counter.stop()
    counter.unpatch()
    out = Path(trainer.config.run.output_dir) / f"syncs-rank{trainer.dist.rank}.json"
    out.write_text(json.dumps(counter.steps))
