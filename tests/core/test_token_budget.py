"""Token-budget micro-batches (``[data] max_tokens_per_micro_batch``): packing, balance across
ranks, the loader's sequence and resume, equal losses, config errors, data stats."""

from __future__ import annotations

import itertools
import json
import math
import random
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import attrs
import pytest
import torch

from hyper_core.batching.base import BatchingOptions
from hyper_core.batching.packed import PackedRuntime
from hyper_core.batching.padded import PaddedRuntime
from hyper_core.batching.token_budget import TokenBudgetCollate, assign_to_ranks, pack_by_tokens
from hyper_core.batching.types import SampleFeatures
from hyper_core.cli import main
from hyper_core.config import load_config_dict
from hyper_core.data.dataset import TransformedDataset
from hyper_core.data.errors import SampleError
from hyper_core.data.stats import Batching, TokenBudget
from hyper_core.data.step_loader import StepBatch, StepLoader, StepSampler
from hyper_core.demo.text import ensure_text_demo
from hyper_core.errors import ConfigError
from hyper_core.hookspecs import hookimpl
from hyper_core.testing import read_metrics, run_tiny_training, tiny_text_config

BUDGET = 4096
MAX_SEQ_LEN = 2048


def long_tailed_lengths(n: int, seed: int = 0) -> list[int]:
    """SFT-like sample lengths: log-normal around ~250 tokens, a tail up to ``MAX_SEQ_LEN``."""
    rng = random.Random(seed)
    return [min(MAX_SEQ_LEN, max(8, int(rng.lognormvariate(5.5, 0.9)))) for _ in range(n)]


def test_micro_batches_never_exceed_the_budget_and_keep_every_sample() -> None:
    lengths = long_tailed_lengths(500)
    groups = pack_by_tokens(lengths, BUDGET, max_samples=16)
    assert sorted(itertools.chain.from_iterable(groups)) == list(range(500))
    assert all(sum(lengths[i] for i in g) <= BUDGET and len(g) <= 16 for g in groups)
    # Without the sample cap, first-fit decreasing fills them: one more than the tokens need.
    assert len(pack_by_tokens(lengths, BUDGET)) <= math.ceil(sum(lengths) / BUDGET) + 1
    assert groups == pack_by_tokens(lengths, BUDGET, max_samples=16)


def test_a_sample_over_the_budget_gets_its_own_micro_batch() -> None:
    assert pack_by_tokens([3, 9, 2, 4], 6) == [[0], [1], [2, 3]]


def test_ranks_get_balanced_tokens_on_long_tailed_data() -> None:
    worst = 0.0
    for step in range(20):
        lengths = long_tailed_lengths(128, seed=step)
        shares = assign_to_ranks(lengths, 2)
        assert sorted(shares[0] + shares[1]) == list(range(128))
        totals = [sum(lengths[i] for i in share) for share in shares]
        worst = max(worst, max(totals) / (sum(totals) / 2))
    assert worst <= 1.05
    # The contiguous slices of fixed-size batching are far from it on the same data.
    sliced = max(
        max(sum(ls[:64]), sum(ls[64:])) / (sum(ls) / 2)
        for ls in (long_tailed_lengths(128, seed=s) for s in range(20))
    )
    assert sliced > 1.05


def test_every_rank_gets_a_sample_when_there_are_enough() -> None:
    assert [len(s) for s in assign_to_ranks([100, 1, 1, 1], 4)] == [1, 1, 1, 1]


# -- the step loader --------------------------------------------------------------------------


def transform(sample: Mapping[str, Any]) -> SampleFeatures:
    if sample.get("bad"):
        raise SampleError("missing_image", f"sample {sample['i']} is bad")
    ids = torch.full((sample["n"],), sample["i"] + 1)
    return SampleFeatures(input_ids=ids, labels=ids.clone(), meta={"i": sample["i"]})


def budget_loader(rank: int, world_size: int, bad: set[int] = frozenset(), **kw: Any) -> StepLoader:
    lengths = long_tailed_lengths(256, seed=1)
    raw = [{"i": i, "n": n, "bad": i in bad} for i, n in enumerate(lengths)]
    runtime = PackedRuntime(BatchingOptions(micro_batch_size=64, max_seq_len=2048, pad_token_id=0))
    sampler = StepSampler(256, 64, rank, world_size, shuffle=True, seed=3)
    dataset = TransformedDataset(raw, transform)
    collate = TokenBudgetCollate(runtime, BUDGET)
    return StepLoader(dataset, collate, sampler, balance_ranks=True, **kw)


def sample_ids(batch: StepBatch) -> list[int]:
    return [m["i"] for mb in batch.micro_batches for m in mb.meta]


def test_two_ranks_share_each_step_by_tokens_without_losing_or_repeating_a_sample() -> None:
    bad = {5, 77, 200}
    one = list(itertools.islice(budget_loader(0, 1, bad), 4))
    two = [list(itertools.islice(budget_loader(r, 2, bad), 4)) for r in range(2)]
    for step, (whole, r0, r1) in enumerate(zip(one, *two, strict=True)):
        assert sorted(sample_ids(r0) + sample_ids(r1)) == sorted(sample_ids(whole))
        assert len(sample_ids(whole)) + sum(whole.skipped.values()) == 64
        assert r0.num_samples + r1.num_samples == whole.num_samples
        skipped = {k: r0.skipped.get(k, 0) + r1.skipped.get(k, 0) for k in whole.skipped}
        assert skipped == whole.skipped
        tokens = [sum(mb.num_tokens for mb in b.micro_batches) for b in (r0, r1)]
        assert max(tokens) / (sum(tokens) / 2) <= 1.05, step
        for b in (whole, r0, r1):
            assert all(mb.num_tokens <= BUDGET for mb in b.micro_batches)
    assert sum(sum(b.skipped.values()) for b in one) == 3


def test_a_resumed_loader_continues_the_same_sequence_with_workers() -> None:
    straight = [sample_ids(b) for b in itertools.islice(budget_loader(1, 2), 6)]
    loader = budget_loader(1, 2, num_workers=1)
    first = [sample_ids(b) for b in itertools.islice(loader, 3)]
    state = loader.state_dict()
    resumed = budget_loader(1, 2, num_workers=1)
    resumed.load_state_dict(state)
    rest = [sample_ids(b) for b in itertools.islice(resumed, 3)]
    assert first + rest == straight


# -- training ---------------------------------------------------------------------------------


class MicroBatchTokens:
    """Records each step's micro-batch token counts."""

    def __init__(self) -> None:
        self.steps: list[list[int]] = []

    @hookimpl
    def on_step_begin(self, trainer: Any, state: Any, micro_batches: list[Any]) -> None:
        self.steps.append([mb.num_tokens for mb in micro_batches])


def test_token_budget_losses_equal_fixed_packed_and_padded(tmp_path: Path) -> None:
    evaluation = {"eval": str(ensure_text_demo("eval")), "eval_samples": 24}

    def run(name: str, data: dict[str, Any], micro: int, workers: int = 0) -> tuple[Any, Any]:
        recorder = MicroBatchTokens()
        cfg = tiny_text_config(
            tmp_path / name,
            data={"num_workers": workers, **evaluation, **data},
            training={"steps": 3, "global_batch_size": 16, "micro_batch_size": micro},
        )
        return run_tiny_training(cfg, plugins=[recorder]), recorder.steps

    budget, steps = run("budget", {"max_tokens_per_micro_batch": 128}, micro=16, workers=1)
    fixed, fixed_steps = run("fixed", {}, micro=2)
    padded, _ = run("padded", {"batching": "padded"}, micro=2)
    assert len(budget.losses) == 3
    assert budget.losses == pytest.approx(fixed.losses, abs=1e-5)
    assert budget.losses == pytest.approx(padded.losses, abs=1e-5)
    [evaluated] = budget.eval_metrics
    assert evaluated["eval_loss"] == pytest.approx(fixed.eval_metrics[0]["eval_loss"], abs=1e-5)
    assert all(0 < t <= 128 for step in steps for t in step)
    assert [sum(s) for s in steps] == [sum(s) for s in fixed_steps]
    assert [len(s) for s in steps] == [4, 4, 4]  # ~28 tokens a sample: 4 a micro-batch
    assert [len(s) for s in fixed_steps] == [8, 8, 8]


def test_a_resumed_token_budget_run_gives_the_same_losses(tmp_path: Path) -> None:
    def config(out: Path, steps: int) -> dict[str, Any]:
        return tiny_text_config(
            out,
            data={"max_tokens_per_micro_batch": 128, "num_workers": 0},
            training={"steps": steps, "lr_scheduler": "constant", "micro_batch_size": 8},
            checkpoint={"every_steps": 2, "keep_last": None, "resume": "auto"},
        )

    straight = run_tiny_training(config(tmp_path / "straight", 4))
    run_tiny_training(config(tmp_path / "resumed", 2))
    run_tiny_training(config(tmp_path / "resumed", 4))
    losses = {m["step"]: m["loss"] for m in read_metrics(tmp_path / "resumed") if "loss" in m}
    expected = {m["step"]: m["loss"] for m in straight.metrics if "loss" in m}
    assert sorted(losses) == [1, 2, 3, 4]
    assert losses == pytest.approx(expected, rel=1e-6, abs=1e-6)


# -- config and data stats --------------------------------------------------------------------


def test_a_budget_below_max_seq_len_is_a_config_error(tmp_path: Path) -> None:
    raw = tiny_text_config(tmp_path, data={"max_tokens_per_micro_batch": 100})
    with pytest.raises(ConfigError) as err:
        load_config_dict(raw)
    assert str(err.value).startswith("$.data.max_tokens_per_micro_batch: 100 is less than")


def test_a_budget_with_padded_batching_is_a_config_error() -> None:
    runtime = PaddedRuntime(BatchingOptions(micro_batch_size=2, max_seq_len=8, pad_token_id=0))
    with pytest.raises(ConfigError, match=r"^\$\.data\.max_tokens_per_micro_batch: needs packed"):
        TokenBudgetCollate(runtime, 8)


def test_data_stats_predicts_the_token_budget_micro_batches() -> None:
    # One step of 6 samples (one bad) on 2 ranks, budget 100, at most 2 samples each.
    lengths = [90, 60, None, 40, 30, 25]
    batching = Batching(global_batch_size=6, micro_batch_size=2, world_size=2, max_tokens=100)
    budget = TokenBudget.of(lengths, batching)
    # Ranks: {90, 30} = 120 tokens and {60, 40, 25} = 125; packed [90], [30] and [60, 40], [25].
    assert budget.micro_batches == 4
    assert (budget.tokens.min, budget.tokens.max) == (25, 100)
    assert budget.repeats == 0
    assert budget.imbalance == pytest.approx(125 / 122.5)
    lone = TokenBudget.of([90, 60, 40, 30], attrs.evolve(batching, global_batch_size=4))
    assert lone.repeats == 1  # {90, 30} packs 2 micro-batches, {60, 40} packs 1


def test_data_stats_reports_the_token_budget(tmp_path: Path, capsys: Any) -> None:
    config = str(Path(__file__).resolve().parents[2] / "configs" / "text_demo.toml")
    args = ["data", "stats", config, "--data.max_tokens_per_micro_batch=256", "--samples=64"]
    assert main([*args, "--nproc-per-node=2", "--parallel.strategy=ddp", "--json"]) == 0
    budget = json.loads(capsys.readouterr().out)["token_budget"]
    # ~28 tokens a sample: 8 a micro-batch (micro_batch_size), one per rank and step.
    assert budget["micro_batches"] == 8 and budget["lockstep_repeats"] == 0
    assert 0 < budget["tokens_per_micro_batch"]["max"] <= 256
    assert budget["max_rank_tokens_over_mean"] <= 1.05
    assert main([*args, "--nproc-per-node=2", "--parallel.strategy=ddp"]) == 0
    lines = capsys.readouterr().out.splitlines()
    start = lines.index("token budget 256 (max_tokens_per_micro_batch), in the order read:")
    assert lines[start + 1].startswith("  8 micro-batches; tokens per micro-batch min ")
    assert lines[start + 2].endswith("0 lockstep repeats (0.0% of forwards)")
    assert lines[-1].startswith("steps: 16 samples per step shared by tokens among 2 rank(s)")
    assert main([*args, "--data.batching=padded"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("hyper-train: error: ") and "\n" not in err
    assert "$.data.max_tokens_per_micro_batch: needs packed batching" in err
