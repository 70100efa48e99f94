"""A CUDA run's steps arrive in page-locked memory (``non_blocking`` copies can overlap
compute): one pin per step for a worker's packed buffer, per tensor without workers. Tested
on CPU with ``Tensor.pin_memory`` recorded (it needs a CUDA driver)."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from hyper_core.batching.types import MicroBatch
from hyper_core.data.step_loader import StepLoader, StepSampler, _PackedStep


def _micro_batch(n: int) -> MicroBatch:
    return MicroBatch(
        model_inputs={"input_ids": torch.arange(n).view(1, n), "flag": True},
        loss_inputs={"labels": torch.arange(n).view(1, n)},
        num_samples=1,
        num_tokens=n,
        num_padding=0,
        num_loss_tokens=n,
    )


@pytest.fixture
def pins(monkeypatch: pytest.MonkeyPatch) -> list[torch.Size]:
    calls: list[torch.Size] = []

    def pin(self: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        calls.append(self.shape)
        return self.clone()

    monkeypatch.setattr(torch.Tensor, "pin_memory", pin)
    return calls


def test_a_packed_step_is_pinned_with_one_copy(pins: list[torch.Size]) -> None:
    step = _PackedStep.pack([_micro_batch(3), _micro_batch(5)])
    pinned = step.pin_memory()
    assert pins == [step.buffer.shape]
    for a, b in zip(pinned.unpack(), step.unpack(), strict=True):
        assert torch.equal(a.model_inputs["input_ids"], b.model_inputs["input_ids"])
        assert a.model_inputs["flag"] is True


def test_a_micro_batch_pins_each_tensor(pins: list[torch.Size]) -> None:
    mb = _micro_batch(4).pin_memory()
    assert sorted(pins) == [torch.Size([1, 4])] * 2
    assert mb.model_inputs["flag"] is True and mb.num_tokens == 4


@pytest.mark.parametrize("pin", [False, True])
def test_the_loader_asks_the_dataloader_to_pin(monkeypatch: pytest.MonkeyPatch, pin: bool) -> None:
    seen: dict[str, Any] = {}
    real = torch.utils.data.DataLoader

    def spy(*args: Any, **kwargs: Any) -> Any:
        seen.update(kwargs)
        kwargs["pin_memory"] = False  # no CUDA here
        return real(*args, **kwargs)

    monkeypatch.setattr(torch.utils.data, "DataLoader", spy)
    loader = StepLoader(list(range(8)), lambda f: f, StepSampler(8, 4), pin_memory=pin)
    next(iter(loader))
    assert seen["pin_memory"] is pin
