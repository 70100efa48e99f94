"""The adapter's transform: token layout, positions, media, labels, bad samples."""

from __future__ import annotations

import functools
import pickle
from pathlib import Path
from typing import Any

import pytest
import torch
from PIL import Image

from hyper_core.adapters.base import ModelAssets
from hyper_core.batching.types import IGNORE_INDEX
from hyper_core.data.conversation import parse_conversation
from hyper_core.data.errors import SampleError
from hyper_core.testing.vl import chat
from hyper_qwen_vl.adapters import QwenVLAdapter
from hyper_qwen_vl.tokens import OFFLINE_IDS

VS, VE, PAD = (OFFLINE_IDS[t] for t in ("<|vision_start|>", "<|vision_end|>", "<|image_pad|>"))


def test_features(
    family: str, adapter: QwenVLAdapter, assets: ModelAssets, samples: list[dict[str, Any]]
) -> None:
    text, one, two = (adapter.transform(s, assets, max_seq_len=1024) for s in samples)
    tok = assets.tokenizer

    assert text.media == {} and text.num_images == 0
    assert text.position_ids.shape == (4, text.length)
    assert torch.equal(text.position_ids, torch.arange(text.length).expand(4, -1))
    assert not text.token_fields["mm_token_type_ids"].any()

    # one image: 4×6 patches → 6 tokens between vision_start and vision_end
    ids = one.input_ids.tolist()
    start = ids.index(VS)
    assert ids[start : start + 8] == [VS] + [PAD] * 6 + [VE]
    assert one.media["image_grid_thw"].tolist() == [[1, 4, 6]]
    assert one.media["pixel_values"].shape[0] == 24
    assert one.token_fields["mm_token_type_ids"].tolist() == [int(t == PAD) for t in ids]
    assert one.meta == {"question": "shape"} and one.num_images == 1
    # labels are shifted and cover the answer + <|im_end|> only
    targets = [t for t in one.labels.tolist() if t != IGNORE_INDEX]
    assert tok.decode(targets) == "a square<|im_end|>"
    assert one.labels[-1] == IGNORE_INDEX
    first = next(i for i, t in enumerate(one.labels.tolist()) if t != IGNORE_INDEX)
    assert one.labels[first] == one.input_ids[first + 1]
    # positions: text row counts tokens; mRoPE rows fall behind after the image
    assert torch.equal(one.position_ids[0], torch.arange(one.length))
    assert one.position_ids[1:, -1].tolist() == [one.length - 1 - 6 + 3] * 3  # 6 tokens, max(2, 3)

    # two images, in order
    spans = [i for i, t in enumerate(two.input_ids.tolist()) if t == VS]
    assert len(spans) == 2 and two.num_images == 2
    counts = (two.media["image_grid_thw"].prod(-1) // 4).tolist()
    assert int((two.input_ids == PAD).sum()) == sum(counts)
    assert two.media["pixel_values"].shape[0] == int(two.media["image_grid_thw"].prod(-1).sum())
    grids = two.media["image_grid_thw"].tolist()
    # 112² → 8×8 (factor 28 and 32 alike); 40×150 → 28×140 (Qwen2) or 32×160 (Qwen3): 2×10
    assert grids == [[1, 8, 8], [1, 2, 10]]


def test_system_turn(
    family: str, adapter: QwenVLAdapter, assets: ModelAssets, image_dir: Path
) -> None:
    feat = adapter.transform(chat("hi", "yes", image_dir), assets, max_seq_len=256)
    text = assets.tokenizer.decode(feat.input_ids)
    if family.startswith("qwen3"):
        assert text == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\nyes<|im_end|>\n"
    else:
        assert text.startswith("<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n")


def test_chat_template_agrees_with_transform(
    family: str, adapter: QwenVLAdapter, assets: ModelAssets, samples: list[dict[str, Any]]
) -> None:
    """Inference path (chat template + processor call) = training path (transform)."""
    proc = assets.processor
    for sample in samples:
        feat = adapter.transform(sample, assets, max_seq_len=1024)
        conv = parse_conversation(sample)
        text = proc.apply_chat_template(conv.to_messages())
        images = [Image.open(p.path).convert("RGB") for p in conv.images]
        out = proc(text=text, images=images or None)
        assert out["input_ids"][0].tolist() == feat.input_ids.tolist()
        if images:
            assert torch.equal(out["pixel_values"], feat.media["pixel_values"])


def test_transform_is_picklable(
    adapter: QwenVLAdapter, assets: ModelAssets, samples: list[dict[str, Any]]
) -> None:
    transform = functools.partial(adapter.transform, assets=assets, max_seq_len=1024)
    clone = pickle.loads(pickle.dumps(transform))
    a, b = transform(samples[2]), clone(samples[2])
    assert torch.equal(a.input_ids, b.input_ids) and torch.equal(a.position_ids, b.position_ids)
    assert torch.equal(a.media["pixel_values"], b.media["pixel_values"])


def reason(adapter: QwenVLAdapter, assets: ModelAssets, sample: dict[str, Any], **kw: Any) -> str:
    with pytest.raises(SampleError) as info:
        adapter.transform(sample, assets, max_seq_len=kw.get("max_seq_len", 1024))
    return info.value.reason


def test_bad_samples(adapter: QwenVLAdapter, assets: ModelAssets, image_dir: Path) -> None:
    image = [{"type": "image", "image": "nope.png"}, {"type": "text", "text": "hi"}]
    assert reason(adapter, assets, chat(image, "x", image_dir)) == "missing_image"
    image[0]["image"] = "corrupt.png"
    assert reason(adapter, assets, chat(image, "x", image_dir)) == "corrupt_image"
    # two <image> placeholders, one image
    sample = chat("<image><image>hi", "x", image_dir, images=["odd.png"])
    assert reason(adapter, assets, sample) == "image_token_mismatch"
    # the text itself spells the image token: more image tokens than features
    sample = chat(
        [{"type": "image", "image": "odd.png"}, {"type": "text", "text": "<|image_pad|> hi"}],
        "x",
        image_dir,
    )
    assert reason(adapter, assets, sample) == "image_token_mismatch"
    sample = chat("<|image_pad|>", "x", image_dir)  # no image at all
    assert reason(adapter, assets, sample) == "image_token_mismatch"
    long = chat([{"type": "image", "image": "square.png"}, "describe"], "x", image_dir)
    n = adapter.transform(long, assets, max_seq_len=1024).length
    assert adapter.transform(long, assets, max_seq_len=n).length == n  # image tokens count
    assert reason(adapter, assets, long, max_seq_len=n - 1) == "too_long"
    assert reason(adapter, assets, {"messages": []}) == "bad_format"
