"""``[parallel] cp``: bad values are one ``$.parallel.cp`` error (exit 2) before start-up; the
row split is balanced and covers every token once; Ulysses attention over 2 simulated ranks
(threads exchanging through a fake all-to-all) gives the loss and gradients of the unsplit
model, for packed rows of odd lengths and for a row shorter than ``cp``."""

from __future__ import annotations

import copy
import threading
from pathlib import Path
from typing import Any

import attrs
import pytest
import torch
from test_flash_varlen_kernel import current_kernel

from hyper_core.batching.types import IGNORE_INDEX, MicroBatch
from hyper_core.cli.main import main
from hyper_core.config import ModelConfig
from hyper_core.errors import ConfigError
from hyper_core.parallel.context_parallel import (
    RowSplit,
    install_context_parallel,
    split_micro_batch,
)
from hyper_core.parallel.env import DistEnv

REPO = Path(__file__).resolve().parents[2]
VARLEN = "--model.attn_implementation=varlen"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["--nproc-per-node", "4", "--parallel.cp=3", VARLEN],
            "$.parallel.cp: with 4 ranks (--nproc-per-node 4): dp_replicate (1) × cp (3) does "
            "not divide the world size 4; try cp 2 or 4",
        ),
        (
            ["--nproc-per-node", "1", "--parallel.cp=2", VARLEN],
            "$.parallel.cp: 2 needs 2 ranks or a multiple, got 1",
        ),
        (
            ["--nproc-per-node", "2", "--parallel.cp=2", VARLEN, "--parallel.strategy=ddp"],
            "$.parallel.cp: with 2 ranks (--nproc-per-node 2): 2: strategy 'ddp' has no "
            "context parallelism; use fsdp2",
        ),
        (
            ["--nproc-per-node", "2", "--parallel.cp=2"],
            "$.parallel.cp: with 2 ranks (--nproc-per-node 2): 2 needs [model] "
            'attn_implementation = "varlen"',
        ),
        (
            ["--nproc-per-node", "4", "--parallel.cp=2", "--parallel.ep=3", VARLEN],
            "$.parallel.ep: with 4 ranks (--nproc-per-node 4): 3 does not divide dp_shard (2) "
            "× cp (2) = 4: each group of ep ranks shares out the experts within one FSDP "
            "shard group; try ep 2 or 4",
        ),
        (
            ["--nproc-per-node", "4", "--parallel.cp=2", "--parallel.dp_shard=4", VARLEN],
            "$.parallel.dp_shard: with 4 ranks (--nproc-per-node 4): dp_replicate (1) × "
            "dp_shard (4) × cp (2) must equal the world size (4); try dp_shard 2 or -1",
        ),
        (["--parallel.cp=0"], "$.parallel.cp: must be >= 1, got 0"),
    ],
)
def test_bad_cp_fails_validation_with_its_path(
    args: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    config = str(REPO / "configs" / "text_demo.toml")
    assert main(["config", "validate", config, "--parallel.strategy=fsdp2", *args]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_cp_splits_the_batch_over_the_data_parallel_ranks_only(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # 4 ranks, cp = 2: 2 data shards, so 16 = 8 per micro-batch × 1 × 2 fits...
    config = str(REPO / "configs" / "text_demo.toml")
    common = ["config", "validate", config, "--parallel.strategy=fsdp2", VARLEN]
    assert main([*common, "--nproc-per-node", "4", "--parallel.cp=2"]) == 0
    # ...and 4 data shards (cp = 1) would not: the data-parallel size is world / cp.
    assert main([*common, "--nproc-per-node", "4"]) == 2
    assert "$.training.global_batch_size" in capsys.readouterr().err


@pytest.mark.parametrize("cp", [2, 3])
@pytest.mark.parametrize("length", [1, 2, 5, 12, 117])
def test_row_split_covers_every_token_once_and_balances_causal_work(cp: int, length: int) -> None:
    splits = [RowSplit(cp, r) for r in range(cp)]
    padded = splits[0].padded_length(length)
    assert padded % (2 * cp) == 0 and length <= padded < length + 2 * cp
    parts = [s.local_index(length) for s in splits]
    assert sorted(torch.cat(parts).tolist()) == list(range(padded))
    assert len({len(p) for p in parts}) == 1
    # causal attention work of a token grows with its position: every rank gets the same sum
    assert len({int(p.sum()) for p in parts}) == 1


def test_row_split_pads_with_the_given_value() -> None:
    x = torch.arange(5).view(1, 5)  # padded to 8: chunks of 2, rank 0 keeps 0 and 3
    assert RowSplit(2, 0).take(x, 1, -1).tolist() == [[0, 1, -1, -1]]
    assert RowSplit(2, 1).take(x, 1, -1).tolist() == [[2, 3, 4, -1]]
    positions = torch.arange(5).expand(3, 1, 5)  # mRoPE (3, B, L): split on the last dim
    assert RowSplit(2, 1).take(positions, -1, 0).shape == (3, 1, 4)


def test_padded_bounds_make_each_rows_padding_a_sample() -> None:
    split = RowSplit(2, 0)  # rows of 5 padded to 8
    assert split.padded_bounds([0, 2, 5, 7, 10], 2, 5) == [0, 2, 5, 8, 10, 13, 16]
    assert RowSplit(2, 1).padded_bounds([0, 1], 1, 1) == [0, 1, 4]


def _micro_batch(model_inputs: dict[str, Any], labels: torch.Tensor) -> MicroBatch:
    n = int((labels != IGNORE_INDEX).sum())
    return MicroBatch(
        model_inputs=model_inputs,
        loss_inputs={"labels": labels},
        num_samples=1,
        num_tokens=labels.numel(),
        num_padding=0,
        num_loss_tokens=n,
    )


def test_split_micro_batch_keeps_this_ranks_labels() -> None:
    labels = torch.tensor([[5, 6, IGNORE_INDEX, 7, 8]])
    mb = _micro_batch({}, labels)
    local = split_micro_batch(mb, DistEnv(rank=3, world_size=4, cp=2))  # cp rank 1
    assert local.loss_inputs["labels"].tolist() == [[IGNORE_INDEX, 7, 8, IGNORE_INDEX]]
    assert local.num_loss_tokens == 4  # the normalisation counts the whole row


def _tiny_model(**overrides: Any) -> torch.nn.Module:
    from hyper_core.attention import register
    from hyper_core.plugins import get_plugin_host
    from hyper_core.resolve import resolve_adapter

    register()
    config = ModelConfig(
        adapter="hf_causal_lm",
        config="tiny-qwen2",
        **{"attn_implementation": "varlen", **overrides},
    )
    adapter = resolve_adapter(config, get_plugin_host().registries)
    return adapter.build_model(config, device="cpu")


def test_cp_must_divide_the_heads() -> None:
    model = _tiny_model()  # 4 heads, 2 key/value heads
    with pytest.raises(
        ConfigError, match=r"\$\.parallel\.cp: 4 must divide the 4 attention heads and 2 key"
    ):
        install_context_parallel(model, DistEnv(world_size=4, cp=4))


@attrs.define
class _Exchange:
    """A fake process group of ``n`` threads: all-to-all through a shared board."""

    n: int
    barrier: threading.Barrier
    board: list[Any]
    local: threading.local = attrs.field(factory=threading.local)

    def get_group(self) -> _Exchange:
        return self

    def all_to_all(self, send: torch.Tensor) -> torch.Tensor:
        rank = self.local.rank
        self.barrier.wait()
        self.board[rank] = send.detach().clone()
        self.barrier.wait()
        got = torch.stack([self.board[s][rank] for s in range(self.n)])
        self.barrier.wait()
        return got


class _AllToAll(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, send: torch.Tensor, group: _Exchange) -> torch.Tensor:
        ctx.group = group
        return group.all_to_all(send)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return ctx.group.all_to_all(grad.contiguous()), None


def _fake_all_to_all(
    send: torch.Tensor, out_splits: Any, in_splits: Any, group: _Exchange
) -> torch.Tensor:
    assert out_splits is None and in_splits is None
    return _AllToAll.apply(send, group)


def _batch(lengths_per_row: list[list[int]]) -> tuple[dict[str, Any], torch.Tensor]:
    """A packed micro-batch: rows of samples (equal row lengths), random ids and labels."""
    gen = torch.Generator().manual_seed(0)
    length = sum(lengths_per_row[0])
    ids = torch.randint(3, 200, (len(lengths_per_row), length), generator=gen)
    labels = torch.randint(3, 200, ids.shape, generator=gen)
    labels[:, ::3] = IGNORE_INDEX
    positions = torch.cat(
        [torch.cat([torch.arange(n) for n in row]).view(1, -1) for row in lengths_per_row]
    )
    bounds = [0]
    for row in lengths_per_row:
        for n in row:
            bounds.append(bounds[-1] + n)
    cu = torch.tensor(bounds, dtype=torch.int32)
    longest = max(max(row) for row in lengths_per_row)
    inputs = {
        "input_ids": ids,
        "position_ids": positions,
        "cu_seq_lens_q": cu,
        "cu_seq_lens_k": cu,
        "max_length_q": longest,
        "max_length_k": longest,
    }
    return inputs, labels


def _loss_and_grads(
    model: torch.nn.Module, inputs: dict[str, Any], labels: torch.Tensor
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    logits = model(**inputs, use_cache=False).logits
    loss = torch.nn.functional.cross_entropy(
        logits.flatten(0, 1).double(), labels.flatten(), ignore_index=IGNORE_INDEX, reduction="sum"
    )
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}


@pytest.mark.parametrize(
    ("rows", "attention"),
    [
        ([[3, 4], [5, 2]], "varlen"),  # 2 rows of 7 (odd: padded to 8), samples cut by the split
        ([[1]], "varlen"),  # a row shorter than cp: rank 1 holds only padding
        ([[13]], "varlen"),
        ([[3, 4], [5, 2]], "flash_varlen"),
    ],
)
def test_ulysses_on_two_ranks_gives_the_unsplit_loss_and_gradients(
    rows: list[list[int]], attention: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``flash_varlen`` runs its kernel (stubbed by per-segment SDPA) over the gathered row."""
    import hyper_core.parallel.all_to_all as exchange_module
    from hyper_core.attention import flash_varlen

    kernel_calls: list[dict[str, Any]] = []
    if attention == "flash_varlen":
        stub = current_kernel(kernel_calls)
        monkeypatch.setitem(flash_varlen.KERNELS, "cpu", flash_varlen.Kernel.of(stub))
    torch.manual_seed(0)
    reference = _tiny_model(attn_implementation=attention)
    reference.train()
    inputs, labels = _batch(rows)
    expected_loss, expected = _loss_and_grads(reference, inputs, labels)

    monkeypatch.setattr(exchange_module, "all_to_all", _fake_all_to_all)
    exchange = _Exchange(2, threading.Barrier(2), [None, None])
    results: list[Any] = [None, None]
    errors: list[BaseException] = []

    def rank_main(rank: int) -> None:
        try:
            exchange.local.rank = rank
            model = copy.deepcopy(reference)
            model.zero_grad(set_to_none=True)
            dist = DistEnv(rank=rank, world_size=2, cp=2, cp_mesh=exchange)
            install_context_parallel(model, dist)
            mb = _micro_batch(dict(inputs), labels)
            local = split_micro_batch(mb, dist).loss_inputs["labels"]
            results[rank] = _loss_and_grads(model, dict(inputs), local)
        except BaseException as exc:  # re-raised in the test thread
            errors.append(exc)
            exchange.barrier.abort()

    threads = [threading.Thread(target=rank_main, args=(r,)) for r in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    if errors:
        raise errors[0]
    if attention == "flash_varlen":  # the unsplit forward, then each rank's on the whole row
        layers = reference.config.num_hidden_layers
        assert len(kernel_calls) == 3 * layers
        padded = -(-sum(rows[0]) // 4) * 4 * len(rows)
        assert all(c["max_q"] <= padded for c in kernel_calls)
    loss = results[0][0] + results[1][0]
    assert float(loss) == pytest.approx(float(expected_loss), rel=1e-6)
    for name, grad in expected.items():
        total = results[0][1][name] + results[1][1][name]
        torch.testing.assert_close(total, grad, rtol=1e-5, atol=1e-6, msg=name)


@pytest.mark.parametrize(
    ("patches", "cp", "expected"),
    [
        ([4, 4, 4, 4], 2, [(0, 2), (2, 4)]),
        ([1, 1, 10], 2, [(0, 2), (2, 3)]),  # the big one alone
        ([10, 1, 1], 2, [(0, 1), (1, 3)]),
        ([16], 2, [(0, 1), (1, 1)]),  # fewer images than ranks: rank 1 runs a dummy
        ([4, 4, 4], 4, [(0, 1), (1, 2), (2, 2), (2, 3)]),
    ],
)
def test_tower_shares_are_contiguous_and_balanced(
    patches: list[int], cp: int, expected: list[tuple[int, int]]
) -> None:
    from hyper_core.parallel.cp_vision import image_shares

    shares = image_shares(patches, cp)
    assert shares == expected
    # every image once, in order (the all-gather in rank order is the images' order)
    assert [i for start, stop in shares for i in range(start, stop)] == list(range(len(patches)))
