"""Bidirectional spans of a sample (:attr:`SampleFeatures.bidirectional_spans
<hyper_core.batching.types.SampleFeatures.bidirectional_spans>`) from a token mask."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch


def true_runs(mask: torch.Tensor) -> tuple[tuple[int, int], ...]:
    """The ``[start, end)`` runs of True in a 1-D boolean ``mask``, in order (transformers'
    ``token_type_ids`` blocks: each maximal run of image tokens is one block)."""
    import torch

    flags = torch.nn.functional.pad(mask.to(torch.int8), (1, 1))
    edges = (flags[1:] - flags[:-1]).nonzero().flatten().tolist()
    return tuple((int(a), int(b)) for a, b in zip(edges[0::2], edges[1::2], strict=True))
