"""The image-only processor: PIL path, odd sizes, several images, min/max pixels, files."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest
import torch
from PIL import Image
from qwen_vl_helpers import ADAPTERS, cached_assets, model_config

from hyper_qwen_vl.processor import QwenVLProcessor
from hyper_qwen_vl.tokens import IMAGE_PAD

CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)


def processor(name: str, **kwargs: int) -> QwenVLProcessor:
    return ADAPTERS[name]().build_assets(model_config(name, **kwargs)).processor


def solid(h: int, w: int, colour: tuple[int, int, int] = (255, 0, 0)) -> Image.Image:
    return Image.new("RGB", (w, h), colour)


def test_no_torchvision() -> None:
    assert "torchvision" not in sys.modules
    proc = cached_assets("qwen2_vl").processor
    assert type(proc.image_processor).__name__ == "Qwen2VLImageProcessorPil"


@pytest.mark.parametrize(
    ("name", "patch", "grid"),
    [
        # 57×93, factor 28: round(57/28)·28 = 56, round(93/28)·28 = 84 → 4×6 patches of 14
        ("qwen2_vl", 14, (1, 4, 6)),
        ("qwen2_5_vl", 14, (1, 4, 6)),
        # factor 32: 64 × 96 → 4×6 patches of 16
        ("qwen3_vl", 16, (1, 4, 6)),
        ("qwen3_vl_moe", 16, (1, 4, 6)),
    ],
)
def test_odd_size_shapes(name: str, patch: int, grid: tuple[int, int, int]) -> None:
    proc = cached_assets(name).processor
    out = proc.process_images([solid(57, 93)])
    assert out["image_grid_thw"].tolist() == [list(grid)]
    assert out["image_grid_thw"].dtype == torch.long
    # rows: one per patch; columns: C · temporal_patch · P · P
    assert out["pixel_values"].shape == (4 * 6, 3 * 2 * patch * patch)
    assert out["pixel_values"].dtype == torch.float32
    assert proc.num_image_tokens(out["image_grid_thw"]) == [6]  # 24 patches / 2²


def test_pixel_layout_and_normalisation() -> None:
    """A solid colour: each patch vector is channel-major (C, T, P, P), CLIP-normalised."""
    proc = cached_assets("qwen2_vl").processor
    pv = proc.process_images([solid(56, 56, (255, 0, 128))])["pixel_values"]
    per_channel = pv.reshape(pv.shape[0], 3, 2 * 14 * 14)
    for c, value in enumerate((255, 0, 128)):
        expected = (value / 255 - CLIP_MEAN[c]) / CLIP_STD[c]
        assert torch.allclose(
            per_channel[:, c], torch.full_like(per_channel[:, c], expected), atol=1e-2
        )
    # Qwen3-VL: mean = std = 0.5, so 255 → 1 and 0 → -1; 64×64 → 4×4 patches of 16
    qwen3 = cached_assets("qwen3_vl").processor.process_images([solid(64, 64, (255, 0, 0))])
    pv3 = qwen3["pixel_values"]
    assert pv3.shape == (16, 3 * 2 * 16 * 16)
    assert torch.allclose(pv3.reshape(16, 3, -1)[:, 0], torch.tensor(1.0), atol=1e-2)
    assert torch.allclose(pv3.reshape(16, 3, -1)[:, 1], torch.tensor(-1.0), atol=1e-2)


def test_several_images_concatenate_in_order(image_dir: Path) -> None:
    proc = cached_assets("qwen2_5_vl").processor
    names = ("odd.png", "square.png", "wide.png")
    images = [Image.open(image_dir / n).convert("RGB") for n in names]
    out = proc.process_images(images)
    # 112×112 → 8×8; 40×150 → round(40/28)=1·28, round(150/28)=5·28 = 28×140, area 3920 ≥ 3136
    assert out["image_grid_thw"].tolist() == [[1, 4, 6], [1, 8, 8], [1, 2, 10]]
    assert out["pixel_values"].shape[0] == 24 + 64 + 20
    assert proc.num_image_tokens(out["image_grid_thw"]) == [6, 16, 5]
    offset = 0
    for image in images:
        alone = proc.process_images([image])["pixel_values"]
        assert torch.equal(out["pixel_values"][offset : offset + alone.shape[0]], alone)
        offset += alone.shape[0]


def test_min_pixels_upscales() -> None:
    proc = processor("qwen2_vl", min_pixels=112 * 112)
    assert proc.min_pixels == 112 * 112
    out = proc.process_images([solid(10, 10)])
    # beta = sqrt(12544 / 100) = 11.2 → ceil(10 · 11.2 / 28) · 28 = 112 → 8 × 8 patches
    assert out["image_grid_thw"].tolist() == [[1, 8, 8]]
    h, w = 8 * 14, 8 * 14
    assert h * w >= proc.min_pixels


def test_max_pixels_downscales() -> None:
    proc = processor("qwen2_vl", max_pixels=112 * 112)
    assert proc.max_pixels == 112 * 112
    out = proc.process_images([solid(448, 448), solid(300, 500)])
    grids = out["image_grid_thw"].tolist()
    # 448² → beta = 4 → floor(448 / 4 / 28) · 28 = 112 → 8 × 8
    assert grids[0] == [1, 8, 8]
    # 300×500: beta = sqrt(150000 / 12544) ≈ 3.458 → floor(3.10)·28 = 84, floor(5.16)·28 = 140
    beta = math.sqrt(300 * 500 / (112 * 112))
    assert grids[1] == [1, math.floor(300 / beta / 28) * 2, math.floor(500 / beta / 28) * 2]
    assert grids[1] == [1, 6, 10]
    for _, gh, gw in grids:
        assert gh * 14 * gw * 14 <= proc.max_pixels


def test_qwen3_pixel_bounds() -> None:
    proc = processor("qwen3_vl", min_pixels=64 * 64, max_pixels=128 * 128)
    out = proc.process_images([solid(57, 93), solid(400, 400), solid(20, 20)])
    for _, gh, gw in out["image_grid_thw"].tolist():
        assert gh % 2 == 0 and gw % 2 == 0  # multiples of patch · merge = 32 px
        assert 64 * 64 <= gh * gw * 16 * 16 <= 128 * 128
    # 57×93 → 64×96; 400² → 128² (beta 3.125); 20² → ceil(20 · 3.2 / 32) · 32 = 64²
    assert out["image_grid_thw"].tolist() == [[1, 4, 6], [1, 8, 8], [1, 4, 4]]


def test_call_expands_image_tokens_like_hf() -> None:
    proc = cached_assets("qwen2_vl").processor
    text = f"<|vision_start|>{IMAGE_PAD}<|vision_end|>a<|vision_start|>{IMAGE_PAD}<|vision_end|>"
    out = proc(text=text, images=[solid(57, 93), solid(112, 112)])
    ids = out["input_ids"][0]
    assert int((ids == proc.image_token_id).sum()) == 6 + 16
    assert torch.equal(out["mm_token_type_ids"][0], (ids == proc.image_token_id).long())
    assert out["pixel_values"].shape[0] == 24 + 64
    with pytest.raises(ValueError, match="images"):
        proc(text=text, images=[solid(57, 93)])


def test_save_and_load_roundtrip(tmp_path: Path) -> None:
    proc = processor("qwen3_vl", min_pixels=64 * 64, max_pixels=256 * 256)
    proc.save_pretrained(tmp_path)
    assert (tmp_path / "preprocessor_config.json").is_file()
    assert (tmp_path / "tokenizer.json").is_file()
    loaded = QwenVLProcessor.from_pretrained(
        tmp_path,
        patch_size=16,
        merge_size=2,
        temporal_patch_size=2,
        defaults=ADAPTERS["qwen3_vl"].image_defaults,
    )
    assert (loaded.min_pixels, loaded.max_pixels) == (64 * 64, 256 * 256)
    assert loaded.tokenizer.get_vocab() == proc.tokenizer.get_vocab()
    assert loaded.chat_template == proc.chat_template
    image = solid(57, 93)
    assert torch.equal(
        loaded.process_images([image])["pixel_values"], proc.process_images([image])["pixel_values"]
    )
    # [model] max_pixels overrides the saved preprocessor config
    smaller = QwenVLProcessor.from_pretrained(
        tmp_path,
        patch_size=16,
        merge_size=2,
        temporal_patch_size=2,
        defaults=ADAPTERS["qwen3_vl"].image_defaults,
        max_pixels=96 * 96,
    )
    assert (smaller.min_pixels, smaller.max_pixels) == (64 * 64, 96 * 96)
