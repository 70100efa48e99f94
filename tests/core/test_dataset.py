"""The transformed dataset: skip or raise on bad samples, bugs propagate."""

from __future__ import annotations

import pickle
from collections.abc import Mapping
from typing import Any

import pytest
import torch

from hyper_core.batching.types import SampleFeatures
from hyper_core.data.dataset import DatasetSplits, Skipped, TransformedDataset
from hyper_core.data.errors import SampleError
from hyper_core.errors import DataError


def transform(sample: Mapping[str, Any]) -> SampleFeatures:
    if sample.get("bad"):
        raise SampleError("too_long", "999 tokens > max_seq_len 8")
    if sample.get("bug"):
        raise KeyError("a bug, not bad data")
    ids = torch.tensor(sample["ids"])
    return SampleFeatures(input_ids=ids, labels=ids.clone(), meta=dict(sample.get("meta", {})))


RAW = [
    {"ids": [1, 2], "meta": {"k": 0}, "_source": {"file": "/d/a.jsonl", "line": 1}},
    {"bad": True, "_source": {"file": "/d/a.jsonl", "line": 2}},
    {"_source": {"file": "/d/a.jsonl", "line": 4}, "_error": ("invalid_json", "Expecting value")},
    {"bug": True},
    {"bad": True},
]


def test_good_samples_are_transformed() -> None:
    ds = TransformedDataset(RAW, transform, on_error="skip")
    assert len(ds) == 5
    item = ds[0]
    assert isinstance(item, SampleFeatures)
    assert item.input_ids.tolist() == [1, 2] and item.meta == {"k": 0}


def test_skip_returns_markers_with_source() -> None:
    ds = TransformedDataset(RAW, transform, on_error="skip")
    assert ds[1] == Skipped(
        "too_long", "999 tokens > max_seq_len 8", {"file": "/d/a.jsonl", "line": 2}
    )
    assert ds[2].reason == "invalid_json" and ds[2].where() == "/d/a.jsonl:4"
    assert ds[4].source is None and ds[4].where() == "sample"


def test_raise_names_file_line_and_reason() -> None:
    ds = TransformedDataset(RAW, transform, on_error="raise")
    with pytest.raises(DataError, match=r"^/d/a\.jsonl:2: too_long: 999 tokens"):
        ds[1]
    with pytest.raises(DataError, match=r"^/d/a\.jsonl:4: invalid_json: Expecting value"):
        ds[2]
    with pytest.raises(DataError, match=r"^sample #4: too_long"):
        ds[4]


@pytest.mark.parametrize("on_error", ["skip", "raise"])
def test_other_exceptions_propagate(on_error: str) -> None:
    ds = TransformedDataset(RAW, transform, on_error=on_error)  # type: ignore[arg-type]
    with pytest.raises(KeyError, match="a bug"):
        ds[3]


def test_picklable_and_validates_on_error() -> None:
    ds = pickle.loads(pickle.dumps(TransformedDataset(RAW, transform, on_error="skip")))
    assert ds[0].input_ids.tolist() == [1, 2] and isinstance(ds[1], Skipped)
    with pytest.raises(ValueError, match="on_error"):
        TransformedDataset(RAW, transform, on_error="ignore")  # type: ignore[arg-type]
    splits = DatasetSplits(train=ds)
    assert splits.eval is None and splits.train is ds
