"""A test plugin: host syncs per training step on this rank.

Between ``on_step_begin`` and ``on_step_end`` it counts ``Tensor.item``/``tolist``/``float``/
``int``/``bool`` called from ``hyper_core`` or ``hyper_encoder_parallel`` (on CPU every tensor
is on the host, so the calls are counted where a CUDA run would wait), as
``tests/core/test_host_syncs.py`` does. At the end of the run each rank writes
``syncs-rank<R>.json``: per step, the count, this rank's micro-batches with images and its
images, and the callers.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from hyper_core import hookimpl

NAMES = ("item", "tolist", "__float__", "__int__", "__bool__")
COUNTED = ("hyper_core", "hyper_encoder_parallel")


class _Counter:
    def __init__(self) -> None:
        import torch

        self.on = False
        self.callers: list[str] = []
        self.steps: list[dict[str, Any]] = []
        self.real = {name: getattr(torch.Tensor, name) for name in NAMES}

    def patch(self) -> None:
        import torch

        for name, real in self.real.items():

            def counted(tensor: Any, *args: Any, _real: Any = real, **kwargs: Any) -> Any:
                frame = sys._getframe(1)
                caller = frame.f_globals.get("__name__", "")
                if self.on and caller.startswith(COUNTED):
                    self.callers.append(f"{caller}:{frame.f_lineno}")
                return _real(tensor, *args, **kwargs)

            setattr(torch.Tensor, name, counted)

    def unpatch(self) -> None:
        import torch

        for name, real in self.real.items():
            setattr(torch.Tensor, name, real)


def _counter(trainer: Any) -> _Counter:
    return trainer.__dict__["_ep_syncs"]


@hookimpl
def on_train_begin(trainer: Any, state: Any) -> None:
    counter = trainer.__dict__["_ep_syncs"] = _Counter()
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
    counter.callers, counter.on = [], True


@hookimpl
def on_step_end(trainer: Any, state: Any, loss: Any, loss_dict: Any, grad_norm: Any) -> None:
    counter = _counter(trainer)
    counter.on = False
    counter.steps[-1].update(syncs=len(counter.callers), callers=counter.callers)


@hookimpl
def on_train_end(trainer: Any, state: Any) -> None:
    counter = _counter(trainer)
    counter.unpatch()
    out = Path(trainer.config.run.output_dir) / f"syncs-rank{trainer.dist.rank}.json"
    out.write_text(json.dumps(counter.steps))
