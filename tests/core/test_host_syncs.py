"""How often the framework's own code waits for the device: ``Tensor.item``/``tolist``/``float``
called from ``hyper_core`` (on CPU every tensor is on the host, so the calls are counted where
a CUDA run would wait).

* a training step: 1, for the loss summed over ranks, the ranks' non-finite-norm count and
  the gradient norm together (whether to apply the update, and ``on_step_end``'s values). The
  step's global count of loss tokens is host arithmetic: the ranks sum host values over the
  CPU backend (``DistEnv.sum_float``; tested in ``test_dist_env_host.py``).
* an evaluation: 2 in all, whatever the number of micro-batches and samples (the sums and the
  per-sample exact-match flags come to the host once, at the end).
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from hyper_core import hookimpl
from hyper_core.testing import run_tiny_training, tiny_text_config


class _Syncs:
    def __init__(self) -> None:
        self.on = False
        self.count = 0


@pytest.fixture
def syncs(monkeypatch: pytest.MonkeyPatch) -> Iterator[_Syncs]:
    counter = _Syncs()
    for name in ("item", "tolist", "__float__", "__int__", "__bool__"):
        real = getattr(torch.Tensor, name)

        def counted(self: torch.Tensor, *args: Any, _real: Any = real, **kwargs: Any) -> Any:
            caller = sys._getframe(1).f_globals.get("__name__", "")
            if counter.on and caller.startswith("hyper_core"):
                counter.count += 1
            return _real(self, *args, **kwargs)

        monkeypatch.setattr(torch.Tensor, name, counted)
    yield counter


class _PerStep:
    def __init__(self, syncs: _Syncs) -> None:
        self.syncs = syncs
        self.per_step: list[int] = []

    @hookimpl
    def on_step_begin(self, trainer: Any, micro_batches: Any) -> None:
        self.syncs.on, self.syncs.count = True, 0

    @hookimpl
    def on_step_end(
        self, trainer: Any, state: Any, loss: Any, loss_dict: Any, grad_norm: Any
    ) -> None:
        self.per_step.append(self.syncs.count)
        self.syncs.on = False


def test_a_training_step_syncs_once(tmp_path: Path, syncs: _Syncs) -> None:
    recorder = _PerStep(syncs)
    cfg = tiny_text_config(tmp_path, training={"global_batch_size": 8, "micro_batch_size": 2})
    run_tiny_training(cfg, steps=3, plugins=[recorder])
    assert recorder.per_step == [1, 1, 1]


def test_an_evaluation_syncs_twice(tmp_path: Path, syncs: _Syncs) -> None:
    from hyper_core.demo.text import ensure_text_demo

    cfg = tiny_text_config(tmp_path, data={"eval": str(ensure_text_demo("eval"))})
    run = run_tiny_training(cfg, steps=1)
    syncs.on, syncs.count = True, 0
    metrics = run.trainer.evaluate()
    syncs.on = False
    assert metrics["count_all"] == 100  # 100 samples, many micro-batches
    assert syncs.count == 2
