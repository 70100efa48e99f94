"""The rank-lockstep helper shared by the train step and evaluation, on two real ranks (gloo)."""

from __future__ import annotations

import ast
import os
import socket
from pathlib import Path

import attrs
import pytest
import torch
import torch.distributed as tdist
import torch.multiprocessing as mp

from hyper_core.parallel.env import DistEnv
from hyper_core.step.lockstep import Lockstep, NoFillerError

#: Each rank's micro-batches, step by step: rank 1 has fewer, then none, then more.
STEPS = {0: [["a0", "a1", "a2"], ["b0"], ["c0"]], 1: [["x0"], [], ["z0", "z1"]]}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _rank(rank: int, port: int, out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    tdist.init_process_group("gloo", rank=rank, world_size=2)
    try:
        dist = DistEnv(rank=rank, world_size=2, device=torch.device("cpu"))
        lockstep: Lockstep[str] = Lockstep(dist)
        schedules = [lockstep.schedule(step) for step in STEPS[rank]]
        peak = dist.all_reduce_max(torch.tensor([rank * 10.0, 5.0 - rank])).tolist()
        Path(out, f"rank-{rank}.txt").write_text(repr((schedules, peak, dist.any_true(rank == 1))))
    finally:
        tdist.destroy_process_group()


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory: pytest.TempPathFactory) -> dict[int, tuple]:
    out = tmp_path_factory.mktemp("lockstep")
    mp.start_processes(_rank, args=(_free_port(), str(out)), nprocs=2, start_method="spawn")
    return {r: ast.literal_eval((out / f"rank-{r}.txt").read_text()) for r in (0, 1)}


def test_fewer_micro_batches_are_padded_with_zero_weight_repeats(two_ranks: dict) -> None:
    assert two_ranks[0][0][0] == [("a0", 1.0), ("a1", 1.0), ("a2", 1.0)]
    assert two_ranks[1][0][0] == [("x0", 1.0), ("x0", 0.0), ("x0", 0.0)]


def test_a_rank_with_none_repeats_the_last_one_it_ran(two_ranks: dict) -> None:
    assert two_ranks[0][0][1] == [("b0", 1.0)]
    assert two_ranks[1][0][1] == [("x0", 0.0)]


def test_the_rank_with_more_sets_the_length(two_ranks: dict) -> None:
    assert two_ranks[0][0][2] == [("c0", 1.0), ("c0", 0.0)]
    assert two_ranks[1][0][2] == [("z0", 1.0), ("z1", 1.0)]


def test_all_reduce_max_and_any_true(two_ranks: dict) -> None:
    for rank in (0, 1):
        assert two_ranks[rank][1] == [10.0, 5.0]
        assert two_ranks[rank][2] is True


@attrs.define(kw_only=True)
class _Peers(DistEnv):
    """A rank whose peers have ``most`` micro-batches (no process group needed)."""

    most: int = 0

    def max_int(self, value: int) -> int:
        return max(value, self.most)


def test_a_rank_that_never_had_a_micro_batch_cannot_pad() -> None:
    with pytest.raises(NoFillerError, match="no usable sample"):
        Lockstep(_Peers(world_size=2, most=2)).schedule([])


def test_one_process_runs_its_own_micro_batches() -> None:
    lockstep: Lockstep[str] = Lockstep(DistEnv())
    assert lockstep.schedule(["a", "b"]) == [("a", 1.0), ("b", 1.0)]
    assert lockstep.schedule([]) == []
