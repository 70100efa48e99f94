"""The offline inference path: chat template + processor + left padding + ``generate``."""

from __future__ import annotations

import torch
from PIL import Image

from hyper_core.adapters.base import ModelAssets


def test_left_padded_batch_matches_single(assets: ModelAssets, tiny_model: torch.nn.Module) -> None:
    proc = assets.processor
    side = proc.tokenizer.padding_side
    proc.tokenizer.padding_side = "left"
    try:
        conversations = [
            [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Shape?"}]}],
            [
                {
                    "role": "user",
                    "content": [{"type": "text", "text": "Describe"}, {"type": "image"}],
                }
            ],
        ]
        images = [
            Image.new("RGB", (93, 57), (255, 0, 0)),
            Image.new("RGB", (112, 112), (0, 0, 255)),
        ]
        texts = [proc.apply_chat_template(c, add_generation_prompt=True) for c in conversations]
        assert texts[0].endswith("<|im_start|>assistant\n")
        batch = proc(text=texts, images=images, padding=True)
        assert (batch["attention_mask"][:, 0] == 0).any()  # one prompt is left-padded
        tiny_model.eval()
        with torch.no_grad():
            # the model computes its own mRoPE positions from mm_token_type_ids here
            batched = tiny_model(**batch).logits[:, -1]
            for i, (text, image) in enumerate(zip(texts, images)):
                single = tiny_model(**proc(text=text, images=[image])).logits[0, -1]
                assert torch.allclose(batched[i], single, atol=1e-4)
            out = tiny_model.generate(**batch, max_new_tokens=3, do_sample=False)
        assert out.shape == (2, batch["input_ids"].shape[1] + 3)
    finally:
        proc.tokenizer.padding_side = side
