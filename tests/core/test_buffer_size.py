"""The look-ahead buffer (``[data] buffer_size``): steps regrouped within a buffer of steps (by
length, or for a token budget), every sample once per epoch, deterministic and resumable, less
padding and fewer micro-batches, config errors and ``data stats``."""

from __future__ import annotations

import itertools
import json
import random
from pathlib import Path
from typing import Any

import pytest
from test_token_budget import sample_ids, transform

from hyper_core.batching.base import BatchingOptions
from hyper_core.batching.packed import PackedRuntime
from hyper_core.batching.padded import PaddedRuntime
from hyper_core.batching.token_budget import (
    StepPlanner,
    TokenBudgetCollate,
    fill_steps_to_budget,
    group_steps_by_length,
)
from hyper_core.cli import main
from hyper_core.config import load_config_dict
from hyper_core.data.dataset import TransformedDataset
from hyper_core.data.stats import Batching, BufferEffect, buffered_order
from hyper_core.data.step_loader import StepLoader, StepSampler
from hyper_core.errors import ConfigError
from hyper_core.testing import read_metrics, run_tiny_training, tiny_text_config

SAMPLES, STEP = 512, 32  # 16 steps per epoch


def long_tailed_lengths(n: int, seed: int = 1) -> list[int]:
    """SFT-like lengths: log-normal around ~90 tokens, a tail up to 1024."""
    rng = random.Random(seed)
    return [min(1024, max(4, int(rng.lognormvariate(4.5, 0.9)))) for _ in range(n)]


def make_loader(
    rank: int = 0,
    world_size: int = 1,
    buffer_steps: int = 1,
    *,
    budget: int | None = None,
    padded: bool = False,
    bad: frozenset[int] = frozenset(),
    seed: int = 3,
    micro: int = 4,
    **kw: Any,
) -> StepLoader:
    lengths = long_tailed_lengths(SAMPLES)
    raw = [{"i": i, "n": n, "bad": i in bad} for i, n in enumerate(lengths)]
    options = BatchingOptions(micro_batch_size=micro, max_seq_len=1024, pad_token_id=0)
    runtime = PaddedRuntime(options) if padded else PackedRuntime(options)
    collate = runtime.collate if budget is None else TokenBudgetCollate(runtime, budget)
    sampler = StepSampler(SAMPLES, STEP, rank, world_size, shuffle=True, seed=seed)
    dataset = TransformedDataset(raw, transform)
    return StepLoader(
        dataset,
        collate,
        sampler,
        balance_ranks=budget is not None,
        buffer_steps=buffer_steps,
        **kw,
    )


def epoch_ids(loader: StepLoader) -> list[list[int]]:
    return [sample_ids(b) for b in itertools.islice(loader, loader.steps_per_epoch)]


# -- the grouping -----------------------------------------------------------------------------


def test_grouping_cuts_a_buffer_into_whole_steps_of_similar_lengths() -> None:
    lengths: list[int | None] = [50, 10, None, 40, 20, 60, 30, None, 70]
    groups = group_steps_by_length(lengths, 3)
    # 10, 20, 30 | 40, 50 and a bad one | 60, 70 and a bad one, each in position order.
    assert groups == [[1, 4, 6], [0, 2, 3], [5, 7, 8]]
    assert sorted(itertools.chain.from_iterable(groups)) == list(range(9))
    assert group_steps_by_length([5, 1, 3], 3) == [[0, 1, 2]]  # one step: as it was
    with pytest.raises(ValueError, match="not whole steps"):
        group_steps_by_length([1, 2, 3], 2)


def test_with_a_budget_the_plan_fills_the_micro_batches() -> None:
    # Budget 10, steps of 2: as read [6, 6] | [4, 4] packs 2 + 1 micro-batches; filled steps
    # [6, 4] | [6, 4] pack 1 + 1.
    assert fill_steps_to_budget([6, 6, 4, 4], 2, 1, 10) == [[0, 2], [1, 3]]
    planner = StepPlanner(2, 1, 10)
    assert planner.cost([6, 6, 4, 4], [[0, 1], [2, 3]]) == (3, 3)
    assert planner([6, 6, 4, 4]) == [[0, 2], [1, 3]]
    assert planner([5, 5, 4, 4]) == [[0, 1], [2, 3]]  # as read already packs 2: kept
    # Long-tailed lengths, 8 steps of 32 on 2 ranks: never more forwards than as read.
    lengths = long_tailed_lengths(256)
    lengths[7] = None
    for budget in (1024, 2048, 4096):
        planner = StepPlanner(32, 2, budget, 16)
        as_read = [list(range(j, j + 32)) for j in range(0, 256, 32)]
        plan = planner(lengths)
        assert sorted(itertools.chain.from_iterable(plan)) == list(range(256))
        assert all(len(step) == 32 for step in plan)
        assert planner.cost(lengths, plan) <= planner.cost(lengths, as_read)


# -- the loader -------------------------------------------------------------------------------


def test_the_default_is_the_order_without_a_buffer() -> None:
    sampler = StepSampler(SAMPLES, STEP, 1, 2, shuffle=True, seed=3)
    expected = [sampler.step_indices(0, s) for s in range(sampler.steps_per_epoch)]
    assert epoch_ids(make_loader(1, 2)) == expected
    assert epoch_ids(make_loader(1, 2, buffer_steps=1)) == expected


@pytest.mark.parametrize("budget", [None, 1024])
def test_every_sample_once_per_epoch_on_two_ranks(budget: int | None) -> None:
    bad = frozenset({5, 77, 300})
    ranks = [make_loader(r, 2, 8, budget=budget, bad=bad, micro=16) for r in range(2)]
    batches = [list(itertools.islice(loader, 16)) for loader in ranks]
    seen = [i for rank in batches for b in rank for i in sample_ids(b)]
    assert sorted(seen) == sorted(set(range(SAMPLES)) - bad)
    skipped = sum(sum(b.skipped.values()) for rank in batches for b in rank)
    assert skipped == len(bad)
    for r0, r1 in zip(*batches, strict=True):
        assert (
            len(sample_ids(r0))
            + len(sample_ids(r1))
            + sum(r0.skipped.values())
            + sum(r1.skipped.values())
            == STEP
        )
        if budget is not None:
            tokens = [sum(mb.num_tokens for mb in b.micro_batches) for b in (r0, r1)]
            assert max(tokens) / (sum(tokens) / 2) <= 1.05
            assert all(mb.num_tokens <= budget for b in (r0, r1) for mb in b.micro_batches)
    # The next epoch is another order of the same samples.
    second = [i for loader in ranks for b in itertools.islice(loader, 16) for i in sample_ids(b)]
    assert sorted(second) == sorted(seen) and second != seen


def test_steps_are_grouped_by_length_within_a_buffer_in_a_shuffled_order() -> None:
    lengths = long_tailed_lengths(SAMPLES)
    steps = [[lengths[i] for i in ids] for ids in epoch_ids(make_loader(0, 1, 4))]
    for buffer in range(4):
        ranges = sorted((min(s), max(s)) for s in steps[4 * buffer : 4 * buffer + 4])
        assert all(hi <= lo for (_, hi), (lo, _) in itertools.pairwise(ranges))
    firsts = [min(s) for s in steps]
    assert any(firsts[b : b + 4] != sorted(firsts[b : b + 4]) for b in range(0, 16, 4))
    # Without the buffer, a step mixes short and long samples.
    plain = [[lengths[i] for i in ids] for ids in epoch_ids(make_loader(0, 1))]
    spread = sum(max(s) - min(s) for s in steps)
    assert spread < sum(max(s) - min(s) for s in plain) / 3


def test_the_sequence_is_deterministic_and_seeded() -> None:
    assert epoch_ids(make_loader(0, 2, 8)) == epoch_ids(make_loader(0, 2, 8))
    assert epoch_ids(make_loader(0, 2, 8)) != epoch_ids(make_loader(0, 2, 8, seed=4))


@pytest.mark.parametrize("budget", [None, 1024])
def test_a_resumed_loader_continues_the_same_sequence_mid_buffer(budget: int | None) -> None:
    straight = [sample_ids(b) for b in itertools.islice(make_loader(1, 2, 4, budget=budget), 22)]
    loader = make_loader(1, 2, 4, budget=budget, num_workers=1)
    first = [sample_ids(b) for b in itertools.islice(loader, 6)]  # inside the second buffer
    state = loader.state_dict()
    assert state == {"epoch": 0, "step_in_epoch": 6}
    resumed = make_loader(1, 2, 4, budget=budget, num_workers=1)
    resumed.load_state_dict(state)
    rest = [sample_ids(b) for b in itertools.islice(resumed, 16)]  # into the next epoch
    assert first + rest == straight


def test_a_buffer_of_8_steps_needs_fewer_micro_batches_under_a_budget() -> None:
    def micro_batches(buffer_steps: int) -> tuple[int, int]:
        ranks = [make_loader(r, 2, buffer_steps, budget=1024, micro=16) for r in range(2)]
        counts = [[len(b.micro_batches) for b in itertools.islice(r, 16)] for r in ranks]
        return sum(map(sum, counts)), sum(2 * max(pair) for pair in zip(*counts, strict=True))

    (plain, plain_forwards), (buffered, forwards) = micro_batches(1), micro_batches(8)
    assert buffered < plain * 0.9, (buffered, plain)
    assert forwards < plain_forwards * 0.9, (forwards, plain_forwards)


def test_a_buffer_of_8_steps_cuts_padding_on_long_tailed_lengths() -> None:
    def padding(buffer_steps: int) -> tuple[int, int]:
        loader = make_loader(0, 1, buffer_steps, padded=True)
        batches = list(itertools.islice(loader, loader.steps_per_epoch))
        tokens = sum(mb.num_tokens for b in batches for mb in b.micro_batches)
        return sum(mb.num_padding for b in batches for mb in b.micro_batches), tokens

    (plain, tokens), (buffered, same_tokens) = padding(1), padding(8)
    assert same_tokens == tokens
    assert buffered < plain / 2, (buffered, plain)


def test_a_buffer_needs_whole_steps() -> None:
    sampler = StepSampler(10, 4, drop_last=False)
    with pytest.raises(ValueError, match="whole steps"):
        StepLoader([], lambda f: [], sampler, buffer_steps=2)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="buffer_steps must be >= 1"):
        StepLoader([], lambda f: [], StepSampler(10, 4), buffer_steps=0)  # type: ignore[arg-type]


# -- data stats -------------------------------------------------------------------------------


def test_data_stats_predicts_the_buffer_as_the_loader_groups() -> None:
    lengths: list[int | None] = [50, 10, None, 40, 20, 60, 30, None, 70, 5]
    batching = Batching(global_batch_size=3, micro_batch_size=3, buffer_steps=2)
    # Buffers of 2 steps: [50, 10, None, 40, 20, 60] and [30, None, 70]; 5 is a partial step.
    assert buffered_order(lengths, batching) == [10, 40, 20, 50, None, 60, 30, None, 70, 5]
    effect = BufferEffect.of(long_tailed_lengths(SAMPLES), Batching(STEP, 4, buffer_steps=8))
    assert effect.padding is not None and effect.unbuffered is not None
    assert effect.padding["padded"].tokens == effect.unbuffered["padded"].tokens
    assert effect.padding["padded"].padding < effect.unbuffered["padded"].padding / 2
    assert effect.token_budget is None
    budget = Batching(STEP, 16, world_size=2, max_tokens=1024, buffer_steps=8)
    effect = BufferEffect.of(long_tailed_lengths(SAMPLES), budget)
    assert effect.token_budget is not None and effect.unbuffered_budget is not None
    assert effect.token_budget.micro_batches < effect.unbuffered_budget.micro_batches * 0.9


def test_data_stats_reports_the_buffer(capsys: Any) -> None:
    config = str(Path(__file__).resolve().parents[2] / "configs" / "text_demo.toml")
    args = ["data", "stats", config, "--samples=128", "--data.buffer_size=4"]
    assert main([*args, "--json", "--data.max_tokens_per_micro_batch=256"]) == 0
    buffer = json.loads(capsys.readouterr().out)["buffer"]
    assert buffer["buffer_size"] == 4 and buffer["padding"] is None
    assert buffer["token_budget"]["micro_batches"] > 0
    assert main([*args, "--data.batching=padded"]) == 0
    lines = capsys.readouterr().out.splitlines()
    start = lines.index(
        "buffer_size 4 (steps regrouped by length within 4 steps), in the order read:"
    )
    assert lines[start + 1].startswith("  padded ")
    assert "without the buffer" in lines[start + 1]
    assert main([*args, "--data.max_tokens_per_micro_batch=256"]) == 0
    lines = capsys.readouterr().out.splitlines()
    title = "buffer_size 4 (steps planned for the token budget within 4 steps), in the order read:"
    assert " (without the buffer " in lines[lines.index(title) + 1]
    assert main(["data", "stats", config, "--samples=16", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["buffer"] is None


# -- config -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"buffer_size": 0}, "$.data.buffer_size: must be >= 1, got 0"),
        ({"buffer_size": 2.5}, "$.data.buffer_size: expected int, got float (2.5)"),
        (
            {"buffer_size": 8, "shuffle": False},
            "$.data.buffer_size: 8 regroups the samples by length, but shuffle = false",
        ),
    ],
)
def test_bad_buffer_sizes_are_config_errors(
    tmp_path: Path, data: dict[str, Any], message: str
) -> None:
    with pytest.raises(ConfigError) as err:
        load_config_dict(tiny_text_config(tmp_path, data=data))
    assert str(err.value).startswith(message)
    assert load_config_dict(tiny_text_config(tmp_path)).data.buffer_size == 1


def test_config_validate_names_the_buffer_size(capsys: Any) -> None:
    config = str(Path(__file__).resolve().parents[2] / "configs" / "text_demo.toml")
    assert main(["config", "validate", config, "--data.buffer_size=0"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == f"hyper-train: error: {config}: $.data.buffer_size: must be >= 1, got 0"
    assert main(["config", "validate", config, "--data.buffer_size=8"]) == 0


def test_a_run_with_a_buffer_pads_less_and_resumes_identically(tmp_path: Path) -> None:
    def config(out: str, steps: int, buffer: int, **data: Any) -> dict[str, Any]:
        return tiny_text_config(
            tmp_path / out,
            data={"buffer_size": buffer, "num_workers": 0, **data},
            training={"steps": steps, "lr_scheduler": "constant"},
            checkpoint={"every_steps": 3, "keep_last": None, "resume": "auto"},
        )

    def padding(run: Any) -> float:
        ratios = [m["padding_ratio"] for m in run.metrics if "padding_ratio" in m]
        return sum(ratios) / len(ratios)

    plain = run_tiny_training(config("plain", 8, 1, batching="padded"))
    buffered = run_tiny_training(config("buffered", 8, 8, batching="padded"))
    assert padding(buffered) < padding(plain) / 3
    # Stopped after step 5, resumed from the checkpoint of step 3 (inside the first buffer).
    budget = {"max_tokens_per_micro_batch": 128, "num_workers": 1}
    run_tiny_training(config("resumed", 5, 4, **budget))
    run_tiny_training(config("resumed", 8, 4, **budget))
    straight = run_tiny_training(config("straight", 8, 4, **budget))
    losses = {m["step"]: m["loss"] for m in read_metrics(tmp_path / "resumed") if "loss" in m}
    assert losses == pytest.approx({m["step"]: m["loss"] for m in straight.metrics if "loss" in m})
    assert sorted(losses) == list(range(1, 9))
