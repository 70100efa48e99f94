"""Chat format, offline tokenizer ids, image expansion, label masking and sample errors."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from kimi_helpers import model_config
from PIL import Image

from hyper_core.adapters.base import ModelAssets
from hyper_core.batching.types import IGNORE_INDEX
from hyper_core.data.conversation import load_images, parse_conversation
from hyper_core.data.errors import SampleError
from hyper_core.testing.vl import chat
from hyper_kimi_k26.adapter import KimiK25Adapter
from hyper_kimi_k26.tokens import KIMI_CHAT, OFFLINE_IDS


def loss_text(assets: ModelAssets, feat: Any) -> str:
    # labels are shifted: labels[i] is the token at i + 1
    ids = [t for t in feat.labels.tolist() if t != IGNORE_INDEX]
    return assets.tokenizer.decode(ids)


def test_offline_ids_match_config(adapter: KimiK25Adapter, assets: ModelAssets) -> None:
    cfg = adapter.hf_config(model_config())
    vocab = assets.tokenizer.get_vocab()
    assert vocab["<|media_pad|>"] == cfg.image_token_id == OFFLINE_IDS["<|media_pad|>"] == 11
    assert vocab["<|media_begin|>"] == cfg.vision_start_token_id
    assert vocab["<|media_end|>"] == cfg.vision_end_token_id
    assert vocab["<|kimi_k25_video_placeholder|>"] == cfg.video_token_id
    assert vocab["[PAD]"] == assets.pad_token_id == cfg.text_config.pad_token_id == 0
    assert vocab["<|im_end|>"] == cfg.text_config.eos_token_id
    assert len(assets.tokenizer) <= cfg.text_config.vocab_size
    for token, idx in OFFLINE_IDS.items():
        assert vocab[token] == idx
        assert assets.tokenizer.encode(token, add_special_tokens=False) == [idx]  # never split


def test_render_text_only() -> None:
    conv = parse_conversation(
        {
            "messages": [
                {"role": "user", "content": "hi"},
                {"role": "assistant", "content": "hello"},
                {"role": "user", "content": "and?"},
                {"role": "assistant", "content": "bye"},
            ]
        }
    )
    assert KIMI_CHAT.render(conv) == (
        "<|im_system|>system<|im_middle|>You are Kimi, an AI assistant created by Moonshot AI."
        "<|im_end|><|im_user|>user<|im_middle|>hi<|im_end|>"
        "<|im_assistant|>assistant<|im_middle|><think></think>hello<|im_end|>"
        "<|im_user|>user<|im_middle|>and?<|im_end|>"
        "<|im_assistant|>assistant<|im_middle|><think></think>bye<|im_end|>"
    )
    with_system = parse_conversation(
        {
            "system": "Be brief.",
            "messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}],
        }
    )
    assert KIMI_CHAT.render(with_system, add_generation_prompt=False).startswith(
        "<|im_system|>system<|im_middle|>Be brief.<|im_end|><|im_user|>"
    )
    prompt, _ = conv.prompt_and_answer()
    assert KIMI_CHAT.render(prompt, add_generation_prompt=True).endswith(
        "<|im_user|>user<|im_middle|>and?<|im_end|><|im_assistant|>assistant<|im_middle|><think></think>"
    )


def test_labels_cover_answers_only(
    adapter: KimiK25Adapter, assets: ModelAssets, image_dir: Path
) -> None:
    sample = {
        "messages": [
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": "hello"},
            {"role": "user", "content": "What shape is it?"},
            {"role": "assistant", "content": "a red circle"},
        ]
    }
    feat = adapter.transform(sample, assets, max_seq_len=512)
    assert loss_text(assets, feat) == "hello<|im_end|>a red circle<|im_end|>"
    assert feat.position_ids is None  # 0..L-1: plain 1-D RoPE
    assert feat.media == {} and feat.num_images == 0
    assert feat.labels[-1] == IGNORE_INDEX
    # labels are the next token where they are set
    ids, labels = feat.input_ids, feat.labels
    keep = labels != IGNORE_INDEX
    assert torch.equal(labels[:-1][keep[:-1]], ids[1:][keep[:-1]])


def test_image_expansion(
    adapter: KimiK25Adapter, assets: ModelAssets, samples: list[dict[str, Any]]
) -> None:
    feats = [adapter.transform(s, assets, max_seq_len=1024) for s in samples]
    assert [f.num_images for f in feats] == [0, 1, 2]
    one, two = feats[1], feats[2]
    # odd.png 57×93 → grid 6×8 → 12 tokens; square 112² → 8×8 → 16; wide 40×150 → 4×12 → 12
    assert one.media["image_grid_thw"].tolist() == [[1, 6, 8]]
    assert two.media["image_grid_thw"].tolist() == [[1, 8, 8], [1, 4, 12]]
    assert one.media["pixel_values"].shape == (48, 3, 14, 14)
    assert two.media["pixel_values"].shape == (64 + 48, 3, 14, 14)
    pad = OFFLINE_IDS["<|media_pad|>"]
    assert int((one.input_ids == pad).sum()) == 12
    assert int((two.input_ids == pad).sum()) == 16 + 12
    text = assets.tokenizer.decode(two.input_ids)
    block = "<|media_begin|>image<|media_content|>" + "<|media_pad|>" * 16 + "<|media_end|>"
    assert block + "Describe the image.<|media_begin|>image<|media_content|>" in text
    assert loss_text(assets, two) == "a blue triangle<|im_end|>"
    assert one.meta == {"question": "shape"}


def test_matches_hf_chat_template_and_processor(
    adapter: KimiK25Adapter, assets: ModelAssets, samples: list[dict[str, Any]]
) -> None:
    """The transform's ids = processor(apply_chat_template(messages), images) (the inference
    path), so training and inference see the same prompt."""
    processor = assets.processor
    for sample in samples:
        feat = adapter.transform(sample, assets, max_seq_len=1024)
        conv = parse_conversation(sample)
        text = processor.apply_chat_template(conv.to_messages())
        if not conv.images:
            assert text == KIMI_CHAT.render(conv)
        images = load_images(conv)
        enc = processor(text, images or None)
        assert enc["input_ids"][0].tolist() == feat.input_ids.tolist()
        if images:
            assert torch.equal(enc["pixel_values"], feat.media["pixel_values"])


def test_sample_errors(adapter: KimiK25Adapter, assets: ModelAssets, image_dir: Path) -> None:
    def reason(sample: dict[str, Any], max_seq_len: int = 1024) -> str:
        with pytest.raises(SampleError) as info:
            adapter.transform(sample, assets, max_seq_len=max_seq_len)
        return info.value.reason

    img = [{"type": "image", "image": "odd.png"}, {"type": "text", "text": "?"}]
    assert reason(chat([{"type": "image", "image": "nope.png"}], "x", image_dir)) == "missing_image"
    assert (
        reason(chat([{"type": "image", "image": "corrupt.png"}], "x", image_dir)) == "corrupt_image"
    )
    assert reason(chat("look <|media_pad|>", "x", image_dir)) == "image_token_mismatch"
    assert reason(chat(img, "x", image_dir), max_seq_len=20) == "too_long"
    assert reason(chat("<image>", "x", image_dir)) == "image_token_mismatch"  # no image given
    # an in-memory image works too
    pil = Image.new("RGB", (30, 30), "blue")
    feat = adapter.transform(
        {
            "messages": [
                {"role": "user", "content": [{"type": "image", "image": pil}]},
                {"role": "assistant", "content": "blue"},
            ]
        },
        assets,
        max_seq_len=256,
    )
    assert feat.media["image_grid_thw"].tolist() == [[1, 4, 4]]
