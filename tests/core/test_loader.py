"""StepSampler and StepLoader: sharding, epochs, skipping, resume, workers."""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from typing import Any

import attrs
import pytest
import torch

from hyper_core.batching.base import BatchingOptions
from hyper_core.batching.padded import PaddedRuntime
from hyper_core.batching.types import MicroBatch, SampleFeatures
from hyper_core.data.dataset import TransformedDataset
from hyper_core.data.errors import SampleError
from hyper_core.data.step_loader import StepBatch, StepLoader, StepSampler
from hyper_core.errors import DataError


def transform(sample: Mapping[str, Any]) -> SampleFeatures:
    i = sample["i"]
    if sample.get("bad"):
        raise SampleError(sample["bad"], f"sample {i} is bad")
    ids = torch.tensor([i + 1] * (1 + i % 3))
    return SampleFeatures(input_ids=ids, labels=ids.clone(), meta={"i": i})


def make_loader(
    n: int = 10, g: int = 4, bad: Mapping[int, str] | None = None, **kw: Any
) -> StepLoader:
    bad = bad or {}
    raw = [{"i": i, **({"bad": bad[i]} if i in bad else {})} for i in range(n)]
    dataset = TransformedDataset(raw, transform, on_error="skip")
    runtime = PaddedRuntime(BatchingOptions(micro_batch_size=2, max_seq_len=8, pad_token_id=0))
    sampler_kw = {k: kw.pop(k) for k in ("rank", "world_size", "shuffle", "seed") if k in kw}
    sampler = StepSampler(n, g, **sampler_kw)
    return StepLoader(dataset, runtime.collate, sampler, **kw)


def sample_ids(batch: StepBatch) -> list[int]:
    return [m["i"] for mb in batch.micro_batches for m in mb.meta]


def test_sampler_partitions_each_epoch_across_ranks() -> None:
    n, g, w = 23, 6, 3
    samplers = [StepSampler(n, g, rank=r, world_size=w, shuffle=True, seed=5) for r in range(w)]
    assert samplers[0].steps_per_epoch == 3 and samplers[0].local_batch_size == 2
    for epoch in (0, 1):
        perm = samplers[0].permutation(epoch)
        assert (
            perm == torch.randperm(n, generator=torch.Generator().manual_seed(5 + epoch)).tolist()
        )
        seen = []
        for step in range(3):
            chunks = [s.step_indices(epoch, step) for s in samplers]
            assert [len(c) for c in chunks] == [2, 2, 2]
            flat = [i for chunk in chunks for i in chunk]
            assert flat == perm[step * g : (step + 1) * g]
            seen += flat
        assert len(set(seen)) == len(seen) == 18 and seen == perm[:18]
    assert samplers[0].permutation(0) != samplers[0].permutation(1)


def test_sampler_no_shuffle_partial_and_errors() -> None:
    s = StepSampler(7, 4, rank=1, world_size=2, shuffle=False, drop_last=False)
    assert s.steps_per_epoch == 2
    assert list(s.iter_epoch(0)) == [[2, 3], [5, 6]]
    assert StepSampler(7, 4, rank=0, world_size=2, shuffle=False, drop_last=False).step_indices(
        0, 1
    ) == [4]
    with pytest.raises(ValueError, match="divisible"):
        StepSampler(10, 6, rank=0, world_size=4)
    with pytest.raises(DataError, match="fewer than one global batch"):
        StepSampler(3, 4)


def test_loader_runs_across_epochs_and_counts_skips() -> None:
    loader = make_loader(n=10, g=4, bad={1: "missing_image", 2: "too_long"}, shuffle=False)
    assert loader.steps_per_epoch == 2
    batches = list(itertools.islice(loader, 5))
    assert [(b.epoch, b.step_in_epoch) for b in batches] == [(0, 0), (0, 1), (1, 0), (1, 1), (2, 0)]
    first = batches[0]
    assert sample_ids(first) == [0, 3] and first.num_samples == 2
    assert first.skipped == {"missing_image": 1, "too_long": 1}
    assert len(first.micro_batches) == 1
    assert sample_ids(batches[1]) == [4, 5, 6, 7] and batches[1].skipped == {}
    assert len(batches[1].micro_batches) == 2
    assert sample_ids(batches[2]) == [0, 3]  # samples 8, 9 dropped (drop_last), new epoch


def test_all_skipped_step_has_no_micro_batches() -> None:
    loader = make_loader(n=4, g=2, bad={0: "bad_format", 1: "bad_format"}, shuffle=False)
    batch = next(iter(loader))
    assert batch.micro_batches == [] and batch.skipped == {"bad_format": 2}
    assert batch.num_samples == 0


def test_state_dict_counts_yielded_batches_and_resumes_exactly() -> None:
    reference = [sample_ids(b) for b in itertools.islice(make_loader(n=12, g=4, seed=3), 8)]
    loader = make_loader(n=12, g=4, seed=3)
    it = iter(loader)
    got = [sample_ids(next(it)) for _ in range(4)]
    assert loader.state_dict() == {"epoch": 1, "step_in_epoch": 1}
    state = loader.state_dict()

    resumed = make_loader(n=12, g=4, seed=3)
    resumed.load_state_dict(state)
    got += [sample_ids(b) for b in itertools.islice(resumed, 4)]
    assert got == reference
    # end of an epoch normalises to the next one
    fresh = make_loader(n=12, g=4, seed=3)
    list(itertools.islice(fresh, 3))
    assert fresh.state_dict() == {"epoch": 1, "step_in_epoch": 0}


def test_load_state_dict_while_iterating_restarts_there() -> None:
    reference = [sample_ids(b) for b in itertools.islice(make_loader(n=12, g=4, seed=1), 6)]
    loader = make_loader(n=12, g=4, seed=1)
    it = iter(loader)
    next(it)
    next(it)
    loader.load_state_dict({"epoch": 1, "step_in_epoch": 2})
    b = next(it)
    assert (b.epoch, b.step_in_epoch) == (1, 2) and sample_ids(b) == reference[5]
    with pytest.raises(ValueError, match="only 3 steps"):
        loader.load_state_dict({"epoch": 0, "step_in_epoch": 4})


def test_iter_epoch_once_keeps_the_partial_batch() -> None:
    loader = make_loader(n=10, g=4, bad={9: "too_long"}, seed=7)
    next(iter(loader))
    batches = list(loader.iter_epoch_once())
    assert [sample_ids(b) for b in batches] == [[0, 1, 2, 3], [4, 5, 6, 7], [8]]
    assert batches[-1].skipped == {"too_long": 1}
    assert loader.state_dict() == {"epoch": 0, "step_in_epoch": 1}


def test_iteration_does_not_touch_the_global_rng() -> None:
    torch.manual_seed(0)
    expected = torch.rand(3)
    torch.manual_seed(0)
    list(itertools.islice(make_loader(n=8, g=2), 5))
    assert torch.equal(torch.rand(3), expected)


def test_workers_give_identical_batches() -> None:
    def run(num_workers: int, persistent: bool = False) -> list[Any]:
        loader = make_loader(
            n=8,
            g=4,
            bad={3: "too_long"},
            num_workers=num_workers,
            persistent_workers=persistent,
            seed=2,
        )
        out = []
        for b in itertools.islice(loader, 3):
            ids = [mb.model_inputs["input_ids"].tolist() for mb in b.micro_batches]
            out.append((sample_ids(b), ids, b.skipped))
        return out

    reference = run(0)
    assert reference == run(2) == run(2, persistent=True)


def odd_tensors_collate(features: list[SampleFeatures]) -> list[MicroBatch]:
    """Micro-batches whose inputs hold every kind of tensor a runtime may produce."""
    out = []
    for f in features:
        i = int(f.input_ids[0])
        g = torch.Generator().manual_seed(i)
        out.append(
            MicroBatch(
                model_inputs={
                    "input_ids": f.input_ids[None],
                    "pixel_values": torch.randn(3, 5, 7, generator=g).transpose(0, 2),
                    "bf16": torch.randn(3, generator=g).to(torch.bfloat16),
                    "mask": torch.rand(2, 3, generator=g) > 0.5,
                    "int8": torch.arange(5, dtype=torch.int8) - i,
                    "empty": torch.zeros(0, 4),
                    "scalar": torch.tensor(float(i)),
                    "max_length": 3,
                    "list": [torch.tensor([i])],
                },
                loss_inputs={"labels": f.labels[None]},
                num_samples=1,
                num_tokens=len(f.input_ids),
                num_padding=0,
                num_loss_tokens=len(f.labels),
            )
        )
    return out


def test_tensors_from_workers_arrive_unchanged() -> None:
    """A worker sends a step's tensors in one shared buffer; they come back equal."""

    def run(num_workers: int) -> list[MicroBatch]:
        raw = [{"i": i} for i in range(6)]
        dataset = TransformedDataset(raw, transform)
        loader = StepLoader(
            dataset, odd_tensors_collate, StepSampler(6, 3, shuffle=False), num_workers=num_workers
        )
        return [mb for b in itertools.islice(loader, 2) for mb in b.micro_batches]

    reference, received = run(0), run(1)
    assert len(reference) == len(received) == 6
    for want, got in zip(reference, received, strict=True):
        for field in ("model_inputs", "loss_inputs"):
            a, b = getattr(want, field), getattr(got, field)
            assert a.keys() == b.keys()
            for key, value in a.items():
                if isinstance(value, torch.Tensor):
                    assert b[key].dtype == value.dtype and b[key].shape == value.shape, key
                    assert torch.equal(b[key], value), key
                elif key == "list":
                    assert [t.tolist() for t in b[key]] == [t.tolist() for t in value]
                else:
                    assert b[key] == value
        assert attrs.evolve(got, model_inputs={}, loss_inputs={}) == attrs.evolve(
            want, model_inputs={}, loss_inputs={}
        )


@pytest.mark.parametrize("num_workers", [0, 2])
def test_on_error_raise_gives_a_clean_data_error(num_workers: int) -> None:
    raw = [
        {
            "i": i,
            **({"bad": "too_long"} if i == 2 else {}),
            "_source": {"file": "/d.jsonl", "line": i + 1},
        }
        for i in range(4)
    ]
    dataset = TransformedDataset(raw, transform, on_error="raise")
    runtime = PaddedRuntime(BatchingOptions(micro_batch_size=2, max_seq_len=8, pad_token_id=0))
    loader = StepLoader(
        dataset, runtime.collate, StepSampler(4, 4, shuffle=False), num_workers=num_workers
    )
    with pytest.raises(DataError) as info:
        next(iter(loader))
    assert str(info.value) == "/d.jsonl:3: too_long: sample 2 is bad"


def test_the_deprecated_module_warns_and_reexports() -> None:
    import importlib
    import sys

    from hyper_core.data import step_loader

    sys.modules.pop("hyper_core.data.loader", None)
    with pytest.warns(DeprecationWarning, match="hyper_core.data.step_loader"):
        old = importlib.import_module("hyper_core.data.loader")
    assert old.StepLoader is step_loader.StepLoader and old.rank_slice is step_loader.rank_slice
