"""The causal-LM loss, normalised by the step's global count of loss tokens."""

from __future__ import annotations

from typing import Any

from ..batching.types import IGNORE_INDEX


def causal_lm_loss(
    outputs: Any, loss_inputs: dict[str, Any], num_loss_tokens: float
) -> tuple[Any, dict[str, Any]]:
    """Sum of token cross-entropies of this micro-batch divided by ``num_loss_tokens``.

    ``loss_inputs["labels"]`` are already shifted (see :class:`SampleFeatures`). Summing here
    and dividing by the *global* count makes accumulation and data parallelism exact.
    """
    import torch

    logits = outputs.logits
    labels = loss_inputs["labels"]
    loss_sum = torch.nn.functional.cross_entropy(
        logits.float().flatten(0, -2),
        labels.flatten(),
        ignore_index=IGNORE_INDEX,
        reduction="sum",
    )
    loss = loss_sum / num_loss_tokens
    return loss, {}
