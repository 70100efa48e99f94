"""Chunked cross-entropy (LM head + loss per chunk of label rows, recomputed in backward):
the same loss and gradients as the default loss on the full logits."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from hyper_core.batching.types import IGNORE_INDEX
from hyper_core.step import chunked_loss
from hyper_core.step.chunked_loss import chunked_causal_lm_loss, lm_head_returns_hidden
from hyper_core.step.loss import causal_lm_loss
from hyper_core.testing import run_tiny_training, tiny_text_config


class _Outputs:
    def __init__(self, logits: torch.Tensor) -> None:
        self.logits = logits


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("chunk", [1, 3, 16, 17, 100])
def test_equals_the_default_loss_and_gradients(chunk: int, bias: bool) -> None:
    torch.manual_seed(0)
    head = torch.nn.Linear(8, 50, bias=bias)
    hidden = torch.randn(17, 8, requires_grad=True)
    labels = torch.randint(0, 50, (17,))
    labels[[2, 9]] = IGNORE_INDEX

    ref, _ = causal_lm_loss(_Outputs(head(hidden)), {"labels": labels}, 13.0)
    ref.backward()
    want = [hidden.grad.clone(), *(p.grad.clone() for p in head.parameters())]
    hidden.grad = None
    head.zero_grad(set_to_none=True)

    loss = chunked_causal_lm_loss(hidden, head, labels, 13.0, chunk)
    loss.backward()
    got = [hidden.grad, *(p.grad for p in head.parameters())]
    assert loss.item() == pytest.approx(ref.item(), abs=1e-6)
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5)


def test_the_head_passes_hidden_states_through_only_while_open() -> None:
    model = torch.nn.Module()
    head = torch.nn.Linear(4, 9)
    model.get_output_embeddings = lambda: head  # type: ignore[method-assign]
    x = torch.randn(2, 4)
    with lm_head_returns_hidden(model) as inside:
        assert inside is head and head(x) is x
    assert head(x).shape == (2, 9)


def _counting(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    calls: list[int] = []
    real = chunked_loss.chunked_causal_lm_loss

    def counted(hidden: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        calls.append(hidden.shape[0])
        return real(hidden, *args, **kwargs)

    monkeypatch.setattr("hyper_core.trainer.trainer.chunked_causal_lm_loss", counted)
    return calls


def test_training_with_small_chunks_matches_unchunked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    plain = run_tiny_training(
        tiny_text_config(tmp_path / "plain", training={"loss_chunk_tokens": None}), steps=4
    )
    calls = _counting(monkeypatch)
    chunked = run_tiny_training(
        tiny_text_config(tmp_path / "chunked", training={"loss_chunk_tokens": 7}), steps=4
    )
    assert calls and all(n > 7 for n in calls)  # every micro-batch went through the chunks
    assert chunked.losses == pytest.approx(plain.losses, abs=1e-5)
    norms = [[m["grad_norm"] for m in run.metrics] for run in (plain, chunked)]
    assert norms[1] == pytest.approx(norms[0], rel=1e-5)


def test_a_plugin_loss_is_never_chunked(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from hyper_core import hookimpl

    class OwnLoss:
        @hookimpl
        def build_loss(self, config: Any, adapter: Any) -> Any:
            def loss_fn(outputs: Any, loss_inputs: Any, n: float) -> Any:
                return causal_lm_loss(outputs, loss_inputs, n)

            return loss_fn

    calls = _counting(monkeypatch)
    run_tiny_training(
        tiny_text_config(tmp_path, training={"loss_chunk_tokens": 7}),
        steps=2,
        plugins=[OwnLoss()],
    )
    assert calls == []
