"""The map-style dataset that applies the adapter's transform and skips bad samples."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal

import attrs
import torch.utils.data

from ..batching.types import SampleFeatures
from ..errors import DataError
from .errors import SampleError
from .jsonl import ERROR_KEY, SOURCE_KEY, format_source

OnError = Literal["skip", "raise"]


@attrs.frozen
class Skipped:
    """Marker returned instead of a sample that could not be used (``on_error = "skip"``)."""

    reason: str
    message: str
    source: dict[str, Any] | None = None

    def where(self) -> str:
        """``file:line`` or ``sample``."""
        return format_source({SOURCE_KEY: self.source} if self.source else None)


class TransformedDataset(torch.utils.data.Dataset):
    """``raw_samples[i]`` through ``transform``; a :class:`SampleError` becomes a skip or a raise.

    Only :class:`SampleError` counts as bad data; any other exception is a bug and propagates.
    Picklable as long as ``transform`` is (needed for non-fork DataLoader workers).
    """

    def __init__(
        self,
        raw_samples: Sequence[Mapping[str, Any]],
        transform: Callable[[Mapping[str, Any]], SampleFeatures],
        on_error: OnError = "skip",
    ) -> None:
        if on_error not in ("skip", "raise"):
            raise ValueError(f"on_error must be 'skip' or 'raise', got {on_error!r}")
        self.raw_samples = raw_samples
        self.transform = transform
        self.on_error = on_error

    def __len__(self) -> int:
        return len(self.raw_samples)

    def __getitem__(self, index: int) -> SampleFeatures | Skipped:
        sample = self.raw_samples[index]
        try:
            if ERROR_KEY in sample:
                reason, message = sample[ERROR_KEY]
                raise SampleError(str(reason), str(message))
            return self.transform(sample)
        except SampleError as exc:
            if self.on_error == "raise":
                where = format_source(sample, index)
                raise DataError(f"{where}: {exc.reason}: {exc.message}") from exc
            source = sample.get(SOURCE_KEY)
            return Skipped(exc.reason, exc.message, dict(source) if source else None)


@attrs.define
class DatasetSplits:
    """The train dataset and the optional eval dataset."""

    train: torch.utils.data.Dataset
    eval: torch.utils.data.Dataset | None = None
