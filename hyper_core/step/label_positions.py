"""Logits only where labels are: the LM head runs on the label positions of a micro-batch.

In VL fine-tuning most positions of a row are image and prompt tokens; only the answer's
carry a label. transformers models take ``logits_to_keep`` as a ``(batch, seq)`` boolean mask
and then project only those positions to the vocabulary (``slice_logits_to_keep``), returning
``(n, vocab)`` logits. :func:`keep_label_positions` adds that mask to a micro-batch's model
inputs and reduces its labels to the same rows, so the loss (which flattens logits and labels)
is the same sum over the same tokens, without the ``(tokens × vocab)`` logits of every other
position. ``loss_inputs["label_mask"]`` keeps where the rows came from.

An adapter whose model needs logits at every position sets
``ModelAdapter.logits_at_labels_only = False``.
"""

from __future__ import annotations

import inspect
from typing import TYPE_CHECKING, Any

import attrs

from ..batching.types import IGNORE_INDEX

if TYPE_CHECKING:
    import torch

    from ..batching.types import MicroBatch


def keep_label_positions(micro_batch: MicroBatch) -> MicroBatch:
    """``micro_batch`` with ``logits_to_keep`` = its label positions and only their labels."""
    labels = micro_batch.loss_inputs["labels"]
    mask = labels != IGNORE_INDEX
    return attrs.evolve(
        micro_batch,
        model_inputs={**micro_batch.model_inputs, "logits_to_keep": mask},
        loss_inputs={**micro_batch.loss_inputs, "labels": labels[mask], "label_mask": mask},
    )


def full_labels(labels: torch.Tensor, loss_inputs: dict[str, Any]) -> torch.Tensor:
    """Labels in their ``(batch, seq)`` layout again (ignored positions filled back in)."""
    mask = loss_inputs.get("label_mask")
    if mask is None:
        return labels
    out = mask.new_full(mask.shape, IGNORE_INDEX, dtype=labels.dtype)
    out[mask] = labels
    return out


def full_predictions(predictions: torch.Tensor, loss_inputs: dict[str, Any]) -> torch.Tensor:
    """Per-position predictions in the ``(batch, seq)`` layout (``-1`` where no logits were
    computed)."""
    mask = loss_inputs.get("label_mask")
    if mask is None:
        return predictions
    out = mask.new_full(mask.shape, -1, dtype=predictions.dtype)
    out[mask] = predictions
    return out


def supports_label_positions(adapter: Any, model: torch.nn.Module) -> bool:
    """Whether the adapter allows it and the model's ``forward`` takes ``logits_to_keep``."""
    if not getattr(adapter, "logits_at_labels_only", False):
        return False
    try:
        params = inspect.signature(type(model).forward).parameters
    except (TypeError, ValueError):
        return False
    return "logits_to_keep" in params
