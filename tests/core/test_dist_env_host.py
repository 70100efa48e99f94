"""Host values (lockstep's micro-batch counts, the step's loss-token count) are reduced over
CPU tensors: an NCCL job's process group (``cuda:nccl,cpu:gloo``) carries them on gloo, and
reading the result never waits for the device's queue."""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.distributed as tdist

from hyper_core.parallel.env import DistEnv


@pytest.fixture
def reduced(monkeypatch: pytest.MonkeyPatch) -> list[torch.Tensor]:
    seen: list[torch.Tensor] = []

    def fake_all_reduce(tensor: torch.Tensor, op: Any = None, **kwargs: Any) -> None:
        seen.append(tensor)
        tensor.mul_(2)  # as if a second rank held the same value (sum) / no larger one (max)

    monkeypatch.setattr(tdist, "all_reduce", fake_all_reduce)
    return seen


def test_host_values_are_reduced_on_the_host(reduced: list[torch.Tensor]) -> None:
    env = DistEnv(rank=0, world_size=2, device=torch.device("meta"))  # stands in for CUDA
    assert env.sum_float(1.5) == 3.0
    assert env.max_int(3) == 6
    assert env.any_true(True)
    assert [t.device.type for t in reduced] == ["cpu", "cpu", "cpu"]


def test_one_process_does_no_collective(reduced: list[torch.Tensor]) -> None:
    env = DistEnv(rank=0, world_size=1)
    assert (env.sum_float(1.5), env.max_int(3), env.any_true(False)) == (1.5, 3, False)
    assert reduced == []
