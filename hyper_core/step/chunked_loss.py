"""Chunked cross-entropy: the LM head and the loss over chunks of label rows, so that no
more than ``chunk × vocab`` logits exist at a time.

With logits at label positions only (:mod:`.label_positions`), a micro-batch still makes
``(label tokens × vocab)`` logits in the forward, their fp32 copy and log-softmax, all kept for
backward: at Qwen's 152k vocabulary the largest buffers of a step. Above
``[training] loss_chunk_tokens`` label tokens, the trainer has the model return the final
hidden states of the label rows instead of logits (:func:`lm_head_returns_hidden`) and computes
:func:`chunked_causal_lm_loss`. Its autograd function computes each chunk's gradients in the
forward (softmax − one-hot, back through the head) into one buffer per input, as fused linear
cross-entropy kernels (Liger) do: neither the logits nor a second copy of the head's weight
gradient outlive their chunk, and backward only scales the buffers. The math per token is the
default loss's (:func:`~.loss.causal_lm_loss`); sums over chunks change the rounding only
(1e-7).

Under FSDP2 the LM head belongs to the root unit, whose parameters stay unsharded from the
forward until the end of backward, so the head's weight is the full one here as in the model.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any

from ..batching.types import IGNORE_INDEX

if TYPE_CHECKING:
    import torch


@contextlib.contextmanager
def lm_head_returns_hidden(model: torch.nn.Module) -> Iterator[torch.nn.Module]:
    """While open, ``model``'s output embedding (the LM head) passes its input through: the
    model's ``logits`` are the hidden states the head would have projected. Yields the head."""
    head = model.get_output_embeddings()
    head.forward = _identity  # an instance attribute, shadowing the class's forward
    try:
        yield head
    finally:
        del head.forward


def _identity(hidden: torch.Tensor) -> torch.Tensor:
    return hidden


def chunked_causal_lm_loss(
    hidden: torch.Tensor,
    head: torch.nn.Module,
    labels: torch.Tensor,
    num_loss_tokens: float,
    chunk_tokens: int,
    context: Callable[[], AbstractContextManager[Any]] = contextlib.nullcontext,
) -> torch.Tensor:
    """Σ cross-entropy(head(hidden), labels) / ``num_loss_tokens``, ``chunk_tokens`` rows at
    a time; ``context`` is the forward's (bf16 autocast), entered around each chunk's head."""
    rows = hidden.reshape(-1, hidden.shape[-1])
    loss_sum = _ChunkedCrossEntropy.apply(
        rows, head.weight, head.bias, labels.reshape(-1), chunk_tokens, context
    )
    return loss_sum / num_loss_tokens


def _chunked_cross_entropy_class() -> type:
    import torch

    class ChunkedCrossEntropy(torch.autograd.Function):
        """The loss sum and, chunk by chunk, its gradients (computed in the forward, as the
        fused linear cross-entropy kernels do): one buffer per gradient, ``chunk × vocab``
        logits at a time, nothing else kept for backward."""

        @staticmethod
        def forward(  # type: ignore[override]
            ctx: Any,
            rows: torch.Tensor,
            weight: torch.Tensor,
            bias: torch.Tensor | None,
            targets: torch.Tensor,
            chunk: int,
            context: Callable[[], AbstractContextManager[Any]],
        ) -> torch.Tensor:
            f = torch.nn.functional
            grad_rows = torch.zeros_like(rows, dtype=torch.float32)
            grad_weight = torch.zeros_like(weight, dtype=torch.float32)
            grad_bias = None if bias is None else torch.zeros_like(bias, dtype=torch.float32)
            total = torch.zeros((), dtype=torch.float32, device=rows.device)
            for start in range(0, rows.shape[0], chunk):
                part, target = rows[start : start + chunk], targets[start : start + chunk]
                with context():
                    logits = f.linear(part, weight, bias)
                logits32 = logits.float()
                total += f.cross_entropy(
                    logits32, target, ignore_index=IGNORE_INDEX, reduction="sum"
                )
                # d(Σ CE)/d logits = softmax − one-hot, zero on ignored rows; then through
                # the head in the logits' dtype, as autograd would.
                grad = logits32.softmax(-1)
                kept = target != IGNORE_INDEX
                grad[kept, target[kept]] -= 1.0
                grad[~kept] = 0.0
                grad = grad.to(logits.dtype)
                with context():
                    grad_rows[start : start + chunk] = grad @ weight.to(grad.dtype)
                if grad.dtype == torch.float32 and part.dtype == torch.float32:
                    grad_weight.addmm_(grad.t(), part)  # no (vocab × hidden) temporary
                else:
                    with context():
                        product = grad.t() @ part.to(grad.dtype)
                    # The fp32 add reads the half-precision product as it goes: one
                    # (vocab × hidden) temporary, not also its fp32 copy.
                    grad_weight.add_(product)
                    del product
                if grad_bias is not None:
                    grad_bias += grad.float().sum(0)
                del logits, logits32, grad
            ctx.save_for_backward(grad_rows, grad_weight, grad_bias)
            ctx.dtypes = (rows.dtype, weight.dtype, None if bias is None else bias.dtype)
            return total

        @staticmethod
        def backward(ctx: Any, grad_output: torch.Tensor) -> tuple[Any, ...]:  # type: ignore[override]
            # Scaled in place: the buffers serve this one backward (no double backward).
            grad_rows, grad_weight, grad_bias = ctx.saved_tensors
            rows_dtype, weight_dtype, bias_dtype = ctx.dtypes
            scale = grad_output.float()
            return (
                grad_rows.mul_(scale).to(rows_dtype),
                grad_weight.mul_(scale).to(weight_dtype),
                None if grad_bias is None else grad_bias.mul_(scale).to(bias_dtype),
                None,
                None,
                None,
            )

    return ChunkedCrossEntropy


class _LazyFunction:
    """The autograd Function, built on first use (this module is importable without torch)."""

    def __init__(self) -> None:
        self._cls: type | None = None

    def apply(self, *args: Any) -> Any:
        if self._cls is None:
            self._cls = _chunked_cross_entropy_class()
        return self._cls.apply(*args)


_ChunkedCrossEntropy = _LazyFunction()
