"""Evaluation sums over ranks count each ``[parallel] cp`` group once: its ranks evaluate the
same rows, so summing every rank would multiply the token and sample counts by ``cp``."""

from __future__ import annotations

from typing import Any

import pytest
import torch.distributed as tdist

from hyper_core.parallel.env import DistEnv
from hyper_core.trainer.evaluate import _Stats


@pytest.mark.parametrize(("world_size", "cp", "groups"), [(2, 1, 2), (2, 2, 1), (4, 2, 2)])
def test_merged_counts_each_cp_group_once(
    monkeypatch: pytest.MonkeyPatch, world_size: int, cp: int, groups: int
) -> None:
    def all_gather_object(out: list[Any], obj: Any) -> None:
        out[:] = [obj] * len(out)  # every rank holds the same sums here

    monkeypatch.setattr(tdist, "all_gather_object", all_gather_object)
    stats = _Stats()
    monkeypatch.setattr(_Stats, "_host", lambda self: (12.0, 6, 3, {"all": [1, 2]}))
    metrics = stats.merged(DistEnv(rank=0, world_size=world_size, cp=cp))
    assert metrics["eval_tokens"] == 6 * groups
    assert metrics["count_all"] == 2 * groups
    assert metrics["eval_loss"] == pytest.approx(2.0) and metrics["accuracy_all"] == 0.5
