"""The vision filler: image-less micro-batches still run the vision tower, loss unchanged."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from hyper_core.testing.vl import chat, loss_of, runtime


@pytest.mark.parametrize("kind", ["packed", "padded"])
def test_filler_runs_the_tower_without_changing_the_loss(
    adapter: Any, assets: Any, tiny_model: torch.nn.Module, image_dir: Any, kind: str
) -> None:
    texts = [chat("What colour is the sky?", "blue", image_dir), chat("Hi", "hello", image_dir)]
    feats = [adapter.transform(s, assets, max_seq_len=512) for s in texts]
    plain_rt, filled_rt = runtime(kind, assets.pad_token_id), runtime(kind, assets.pad_token_id)
    filled_rt.vision_filler = adapter.vision_filler(assets)
    assert filled_rt.vision_filler.num_loss_tokens == 0
    (plain,) = plain_rt.collate(feats)
    (filled,) = filled_rt.collate(feats)
    assert "pixel_values" not in plain.model_inputs and "pixel_values" in filled.model_inputs
    assert (filled.num_samples, filled.num_tokens, filled.num_images) == (
        plain.num_samples, plain.num_tokens, 0,
    )  # fmt: skip
    assert filled.meta[-1] == {"filler": True}
    kwargs = adapter.forward_kwargs()
    a = loss_of(tiny_model, plain, forward_kwargs=kwargs)
    b = loss_of(tiny_model, filled, forward_kwargs=kwargs)
    torch.testing.assert_close(a, b, atol=1e-6, rtol=0)
    b.backward()
    vision = tiny_model.get_submodule(adapter.vision_module)
    assert all(p.grad is not None for p in vision.parameters() if p.requires_grad)
    # A micro-batch with an image still gets it for its video (see test_video_filler.py).
    img = adapter.transform(
        chat([{"type": "image", "image": "odd.png"}], "x", image_dir), assets, max_seq_len=512
    )
    (with_image,) = filled_rt.collate([img])
    assert with_image.num_samples == 1 and with_image.meta[-1] == {"filler": True}
