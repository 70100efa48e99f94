"""The torchvision-free image processor: sizes, grids, token counts and the pixel layout.

Expected values are computed by hand from the reference ``navit_resize`` (transformers'
``Kimi_K25ImageProcessor``, torchvision-only): never upscale; scale = min(1,
sqrt(max_patches / ((h // 14) · (w // 14))), 512·14 / h, 512·14 / w); new side = int(side ·
scale); pad bottom/right to multiples of 28; grid = padded / 14; tokens = grid_h · grid_w / 4.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

from hyper_kimi_k26.processor import KimiImageProcessor

# (height, width) -> (resized, padded, grid, tokens) with the defaults (16384 patches, 512/side)
DEFAULT_CASES = {
    (57, 93): ((57, 93), (84, 112), (6, 8), 12),
    (112, 112): ((112, 112), (112, 112), (8, 8), 16),
    (40, 150): ((40, 150), (56, 168), (4, 12), 12),
    (1, 1): ((1, 1), (28, 28), (2, 2), 1),
    (28, 28): ((28, 28), (28, 28), (2, 2), 1),
    (29, 29): ((29, 29), (56, 56), (4, 4), 4),
    (333, 517): ((333, 517), (336, 532), (24, 38), 228),
    # the per-side limit: scale = 7168 / 20000 = 0.3584 → 7168 × int(10.752)
    (20000, 30): ((7168, 10), (7168, 28), (512, 2), 256),
    # the patch budget: (2000 // 14) · (3000 // 14) = 142 · 214 = 30388 patches > 16384,
    # scale = sqrt(16384 / 30388) = 0.73427… → int(1468.5) × int(2202.8)
    (2000, 3000): ((1468, 2202), (1484, 2212), (106, 158), 4187),
}


@pytest.mark.parametrize("size", list(DEFAULT_CASES), ids=lambda s: f"{s[0]}x{s[1]}")
def test_plan_matches_reference_rules(size: tuple[int, int]) -> None:
    resized, padded, grid, tokens = DEFAULT_CASES[size]
    proc = KimiImageProcessor()
    plan = proc.plan(*size)
    assert (plan.resized, plan.padded, plan.grid) == (resized, padded, grid)
    assert proc.num_image_tokens(*size) == tokens
    assert plan.num_patches == grid[0] * grid[1] == 4 * tokens


def test_max_pixels_scales_down() -> None:
    # max_pixels = 200 · 14² → 200 patches; 333×517 has 23 · 36 = 828 → scale sqrt(200/828)
    proc = KimiImageProcessor.build(path=None, patch_size=14, merge_size=2, max_pixels=200 * 196)
    assert proc.max_patches == 200
    plan = proc.plan(333, 517)
    assert plan.resized == (163, 254)  # int(163.66), int(254.09)
    assert plan.padded == (168, 280) and plan.grid == (12, 20)
    assert proc.num_image_tokens(333, 517) == 60


def test_min_pixels_scales_up() -> None:
    # 40×150 = 6000 px < 112² = 12544: up = sqrt(12544 / 6000) = 1.4459… → ceil → 58 × 217
    proc = KimiImageProcessor.build(path=None, patch_size=14, merge_size=2, min_pixels=112 * 112)
    plan = proc.plan(40, 150)
    assert plan.resized == (58, 217)
    assert plan.resized[0] * plan.resized[1] >= 112 * 112
    assert plan.padded == (84, 224) and plan.grid == (6, 16)
    # images already large enough are untouched
    assert proc.plan(112, 112).resized == (112, 112)


def _reference_patchify(image: np.ndarray, proc: KimiImageProcessor) -> torch.Tensor:
    """The reference layout, written like transformers' ``Kimi_K25ImageProcessor``: pad with 0,
    rescale + normalise, then (C, gh, p, gw, p) → (gh, gw, C, p, p) → (gh·gw, C, p, p)."""
    h, w = image.shape[:2]
    plan = proc.plan(h, w)
    assert plan.resized == (h, w)
    x = torch.zeros(1, 3, *plan.padded)
    x[0, :, :h, :w] = torch.from_numpy(image).permute(2, 0, 1).float()
    x = (x / 255.0 - 0.5) / 0.5
    p = proc.patch_size
    gh, gw = plan.grid
    x = x.reshape(1, 3, gh, p, gw, p).permute(0, 2, 4, 1, 3, 5)
    return x.reshape(gh * gw, 3, p, p)


@pytest.mark.parametrize("size", [(57, 93), (40, 150), (29, 29), (112, 112)])
def test_pixel_layout(size: tuple[int, int]) -> None:
    rng = np.random.default_rng(1)
    pixels = rng.integers(0, 256, (*size, 3), dtype=np.uint8)
    proc = KimiImageProcessor()
    out = proc([Image.fromarray(pixels)])
    plan = proc.plan(*size)
    assert out["pixel_values"].dtype == torch.float32
    assert out["pixel_values"].shape == (plan.num_patches, 3, 14, 14)
    assert out["image_grid_thw"].tolist() == [[1, *plan.grid]]
    assert torch.allclose(out["pixel_values"], _reference_patchify(pixels, proc), atol=1e-6)
    # patch (r, c) is rows r·14.., columns c·14.. of the image; padding is -1 after normalising
    gw = plan.grid[1]
    assert torch.allclose(
        out["pixel_values"][0, 0],
        torch.from_numpy(pixels[:14, :14, 0]).float() / 127.5 - 1.0,
        atol=1e-6,
    )
    if plan.padded != size:
        last = out["pixel_values"][-1]  # the bottom-right patch is (partly) padding
        assert torch.all(last[:, -1, -1] == -1.0)
    if size == (57, 93):
        r, c = 2, 5
        expected = torch.from_numpy(pixels[r * 14 : r * 14 + 14, c * 14 : c * 14 + 14]).float()
        assert torch.allclose(
            out["pixel_values"][r * gw + c], expected.permute(2, 0, 1) / 127.5 - 1.0, atol=1e-6
        )


def test_several_images_concatenate() -> None:
    proc = KimiImageProcessor()
    images = [
        Image.new("RGB", (93, 57), "red"),
        Image.new("RGB", (150, 40)),
        Image.new("L", (5, 9)),
    ]
    out = proc(images)
    assert out["image_grid_thw"].tolist() == [[1, 6, 8], [1, 4, 12], [1, 2, 2]]
    assert out["pixel_values"].shape == (48 + 48 + 4, 3, 14, 14)
    # a resized image keeps its layout too: 2000×3000 → 1468×2202, padded to 1484×2212
    big = proc([Image.new("RGB", (3000, 2000), (10, 200, 30))])
    assert big["image_grid_thw"].tolist() == [[1, 106, 158]]
    assert big["pixel_values"].shape == (106 * 158, 3, 14, 14)


def test_preprocessor_config_roundtrip(tmp_path) -> None:
    proc = KimiImageProcessor(max_patches=4096, max_patches_per_side=256, min_pixels=3136)
    proc.save_pretrained(tmp_path)
    saved = (tmp_path / "preprocessor_config.json").read_text()
    assert '"image_processor_type": "Kimi_K25ImageProcessor"' in saved
    again = KimiImageProcessor.build(path=tmp_path, patch_size=14, merge_size=2)
    assert (again.max_patches, again.max_patches_per_side, again.min_pixels) == (4096, 256, 3136)
    # the hub's remote-code format is read as JSON (its code is never imported)
    (tmp_path / "preprocessor_config.json").write_text(
        '{"auto_map": {"AutoProcessor": "kimi_k25_processor.KimiK25Processor"},'
        ' "media_proc_cfg": {"in_patch_limit": 16384, "patch_limit_on_one_side": 512,'
        ' "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5], "patch_size": 14}}'
    )
    hub = KimiImageProcessor.build(path=tmp_path, patch_size=14, merge_size=2, max_pixels=196 * 100)
    assert (hub.max_patches, hub.max_patches_per_side) == (100, 512)
