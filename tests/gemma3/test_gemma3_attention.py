"""Gemma 3's image tokens attend both ways inside the causal decoder: a packed ``varlen`` row
with the samples' bidirectional spans equals each sample alone under transformers' own
``token_type_ids`` mask (SDPA), loss and gradients; without the spans it does not."""

from __future__ import annotations

import warnings
from typing import Any

import pytest
import torch

from hyper_core.adapters.vision_context import VisionContext
from hyper_core.attention import BIDIRECTIONAL_SPANS
from hyper_core.testing.conformance import AdapterUnderTest
from hyper_core.testing.vl import loss_and_grads, loss_of, micro_batch

PLUGIN = "hyper_gemma3.plugin"
VARLEN = {"config": "tiny", "attn_implementation": "varlen"}


@pytest.fixture(scope="module")
def subject(tmp_path_factory: pytest.TempPathFactory) -> AdapterUnderTest:
    return AdapterUnderTest(
        "gemma3", VARLEN, plugins=[PLUGIN], workdir=tmp_path_factory.mktemp("g")
    )


def _one_by_one(model: Any, features: list[Any], pad: int) -> tuple[float, dict[str, Any]]:
    """Σ over samples of each one's loss alone (SDPA, transformers' mask), over all loss tokens."""
    total = sum(f.num_loss_tokens for f in features)
    model.zero_grad(set_to_none=True)
    loss = 0.0
    for f in features:
        one = loss_of(model, micro_batch([f], "packed", pad), num_loss_tokens=total)
        one.backward()
        loss += one.item()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return loss, grads


def test_packed_with_spans_equals_one_by_one(subject: AdapterUnderTest) -> None:
    torch.manual_seed(0)
    model = subject.build_model()
    features = subject.features()
    assert sum(f.num_images for f in features) >= 2 and all(
        len(f.bidirectional_spans) == f.num_images for f in features
    )
    pad = subject.assets.pad_token_id
    packed = micro_batch(features, "packed", pad, varlen_kwargs=True)
    assert BIDIRECTIONAL_SPANS in packed.model_inputs
    loss, grads = loss_and_grads(model, packed)

    model.set_attn_implementation("sdpa")
    ref_loss, ref_grads = _one_by_one(model, features, pad)
    assert abs(loss - ref_loss) <= 1e-5, (loss, ref_loss)
    assert grads.keys() == ref_grads.keys()
    for name, g in grads.items():
        torch.testing.assert_close(g, ref_grads[name], atol=1e-5, rtol=1e-4, msg=name)

    # the control: the same row, causal only (no spans, no token_type_ids), differs
    model.set_attn_implementation("varlen")
    causal = {
        k: v
        for k, v in packed.model_inputs.items()
        if k not in (BIDIRECTIONAL_SPANS, "token_type_ids")
    }
    packed.model_inputs = causal
    assert abs(loss_and_grads(model, packed)[0] - ref_loss) > 1e-4


def test_flex_varlen_row_equals_one_by_one_logits(subject: AdapterUnderTest) -> None:
    """``flex_varlen`` (its ``BlockMask`` from the row's samples and spans) gives each
    sample's logits of transformers' own mask (forward: flex has no CPU backward)."""
    torch.manual_seed(0)
    model = subject.build_model(attn_implementation="flex_varlen").eval()
    features = subject.features()
    pad = subject.assets.pad_token_id
    packed = micro_batch(features, "packed", pad, varlen_kwargs=True)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # flex without compile on CPU: unfused, says so
        row = model(**packed.model_inputs, use_cache=False).logits[0]
        model.set_attn_implementation("sdpa")
        alone = [
            model(**micro_batch([f], "packed", pad).model_inputs, use_cache=False).logits[0]
            for f in features
        ]
    torch.testing.assert_close(row, torch.cat(alone), atol=1e-5, rtol=1e-4)


def test_vision_encoder_defaults_feed_the_forward(subject: AdapterUnderTest) -> None:
    """``call_vision_encoder`` gives per-image features; ``inject_vision_outputs`` hands
    them to Gemma 3's forward (one concatenated tensor): the logits of the pixels' forward."""
    torch.manual_seed(0)
    model = subject.build_model().eval()
    adapter = subject.adapter
    mb = subject.micro_batch("packed")
    context = VisionContext.of(mb, model.config)
    with torch.no_grad():
        out = adapter.call_vision_encoder(model, mb.model_inputs, context)
        assert len(out.pooler_output) == mb.num_images
        assert len(adapter.split_vision_inputs(mb.model_inputs, context)) == mb.num_images
        injected = adapter.inject_vision_outputs(mb.model_inputs, out, context)
        assert "pixel_values" not in injected
        plain = model(**mb.model_inputs, use_cache=False).logits
        via = model(**injected, use_cache=False).logits
    torch.testing.assert_close(via, plain)


def test_spans_that_cross_samples_are_refused(subject: AdapterUnderTest) -> None:
    model = subject.build_model()
    features = subject.features()
    mb = micro_batch(features, "packed", subject.assets.pad_token_id, varlen_kwargs=True)
    first = features[0].length
    mb.model_inputs[BIDIRECTIONAL_SPANS] = torch.tensor([[first - 2, first + 2]])
    with pytest.raises(ValueError, match="crosses a sample boundary"):
        loss_of(model, mb)
