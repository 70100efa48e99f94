"""Kimi-K2.5/K2.6 image preprocessing without torchvision, and an images-only processor.

transformers 5.24's ``Kimi_K25ImageProcessor`` is torchvision-only (and its processor also
needs the torchvision video processor), so :class:`KimiImageProcessor` re-implements its
documented behaviour with PIL + numpy:

1. **Resize** (``navit_resize``): never upscale; scale down so that the patch count
   ``(h // 14) · (w // 14)`` fits ``max_patches`` (16384) and each side fits
   ``max_patches_per_side`` (512) patches; the new size is ``int(side · scale)``, at least 1.
   ``[model] max_pixels`` sets ``max_patches = max_pixels // 14²``. ``[model] min_pixels``
   (not in the reference; off by default) upscales images smaller than that area.
2. **Pad** bottom/right with zeros to multiples of ``patch · merge`` (28), so the patch grid
   splits into whole 2×2 merge windows (the tower pools every 2×2 window into one token).
   Padding happens before normalisation, so padded pixels become ``(0 - 0.5) / 0.5 = -1``,
   as in the reference.
3. **Rescale and normalise**: ``x / 255``, then ``(x - 0.5) / 0.5`` per channel.
4. **Patchify**: ``pixel_values`` of shape ``(Σ gh·gw, 3, 14, 14)``: each image's patches in
   row-major order of its ``(gh, gw)`` grid (the vision tower's ``Conv2d`` patch embedding
   takes each ``(3, 14, 14)`` patch; its 2-D RoPE, position-table resampling and 2×2 merge
   follow ``image_grid_thw``), images concatenated along dim 0; ``image_grid_thw`` ``(n, 3)`` =
   ``(1, gh, gw)``. Image ``i`` stands for ``gh·gw / 4`` ``<|media_pad|>`` tokens.

Resampling is PIL's bicubic, the reference's is torchvision's antialiased bicubic: sizes, grids
and token counts are identical, pixel values of resized images differ slightly.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import attrs

from hyper_core.adapters.processor import ImageTextProcessor

from .tokens import IMAGE_PLACEHOLDER, IMAGE_PREFIX, IMAGE_SUFFIX, MEDIA_PAD

if TYPE_CHECKING:
    import torch
    from PIL import Image

PREPROCESSOR_FILE = "preprocessor_config.json"
#: transformers' name of the reference image processor (written to preprocessor_config.json).
HF_IMAGE_PROCESSOR_TYPE = "Kimi_K25ImageProcessor"
_MEAN = (0.5, 0.5, 0.5)
_STD = (0.5, 0.5, 0.5)
_BICUBIC = 3


@attrs.frozen
class ResizePlan:
    """Sizes of one image: after resizing, after padding, and its patch grid."""

    resized: tuple[int, int]  # (height, width)
    padded: tuple[int, int]
    grid: tuple[int, int]  # (gh, gw) patches

    @property
    def num_patches(self) -> int:
        """Patches of the image (rows of ``pixel_values``)."""
        return self.grid[0] * self.grid[1]


class KimiImageProcessor:
    """PIL + numpy image processor with the reference's resize/pad/patch layout (see module)."""

    def __init__(
        self,
        *,
        patch_size: int = 14,
        merge_size: int = 2,
        max_patches: int = 16384,
        max_patches_per_side: int = 512,
        min_pixels: int | None = None,
        image_mean: Sequence[float] = _MEAN,
        image_std: Sequence[float] = _STD,
        resample: int = _BICUBIC,
    ) -> None:
        if max_patches < 1 or max_patches_per_side < 1:
            raise ValueError("max_patches and max_patches_per_side must be >= 1")
        self.patch_size = int(patch_size)
        self.merge_size = int(merge_size)
        self.max_patches = int(max_patches)
        self.max_patches_per_side = int(max_patches_per_side)
        self.min_pixels = int(min_pixels) if min_pixels else None
        self.image_mean = tuple(float(x) for x in image_mean)
        self.image_std = tuple(float(x) for x in image_std)
        self.resample = int(resample)

    # -- sizes ---------------------------------------------------------------------------------

    @property
    def max_pixels(self) -> int:
        """The area limit ``max_patches · patch²``."""
        return self.max_patches * self.patch_size**2

    def plan(self, height: int, width: int) -> ResizePlan:
        """Resized size, padded size and patch grid of a ``height × width`` image."""
        p = self.patch_size
        side = self.max_patches_per_side * p
        patches = max(1.0, height // p) * max(1.0, width // p)
        scale = min(
            1.0,
            math.sqrt(self.max_patches / patches),
            side / height,
            side / width,
        )
        if self.min_pixels and height * width < self.min_pixels:
            up = math.sqrt(self.min_pixels / (height * width))
            scale = min(up, math.sqrt(self.max_patches / patches), side / height, side / width)
        if scale > 1.0:
            new_h, new_w = math.ceil(height * scale), math.ceil(width * scale)
        else:
            new_h, new_w = max(1, int(height * scale)), max(1, int(width * scale))
        new_h, new_w = min(new_h, side), min(new_w, side)
        factor = p * self.merge_size
        pad_h = -(-new_h // factor) * factor
        pad_w = -(-new_w // factor) * factor
        return ResizePlan(
            resized=(new_h, new_w), padded=(pad_h, pad_w), grid=(pad_h // p, pad_w // p)
        )

    def num_image_tokens(self, height: int, width: int) -> int:
        """``<|media_pad|>`` tokens of a ``height × width`` image: ``gh · gw / merge²``."""
        return self.plan(height, width).num_patches // self.merge_size**2

    # -- pixels --------------------------------------------------------------------------------

    def patchify(self, image: Image.Image) -> tuple[Any, ResizePlan]:
        """``(gh·gw, 3, P, P)`` float32 numpy patches of one RGB image, and its plan."""
        import numpy as np
        from PIL import Image as PILImage

        img = image if image.mode == "RGB" else image.convert("RGB")
        width, height = img.size
        plan = self.plan(height, width)
        new_h, new_w = plan.resized
        if (new_h, new_w) != (height, width):
            img = img.resize((new_w, new_h), resample=PILImage.Resampling(self.resample))
        pixels = np.asarray(img, dtype=np.float32)  # (H, W, 3) in 0..255
        pad_h, pad_w = plan.padded
        canvas = np.zeros((pad_h, pad_w, 3), dtype=np.float32)
        canvas[:new_h, :new_w] = pixels
        mean = np.asarray(self.image_mean, dtype=np.float32)
        std = np.asarray(self.image_std, dtype=np.float32)
        canvas = (canvas / 255.0 - mean) / std
        p = self.patch_size
        gh, gw = plan.grid
        patches = (
            canvas.transpose(2, 0, 1)  # (3, H, W)
            .reshape(3, gh, p, gw, p)
            .transpose(1, 3, 0, 2, 4)  # (gh, gw, 3, p, p)
            .reshape(gh * gw, 3, p, p)
        )
        return np.ascontiguousarray(patches), plan

    def __call__(self, images: Sequence[Image.Image]) -> dict[str, torch.Tensor]:
        """``pixel_values`` ``(Σ patches, 3, P, P)`` float32 and ``image_grid_thw`` ``(n, 3)``."""
        import numpy as np
        import torch

        if not images:
            raise ValueError("no images")
        chunks, grids = [], []
        for image in images:
            patches, plan = self.patchify(image)
            chunks.append(patches)
            grids.append((1, *plan.grid))
        return {
            "pixel_values": torch.from_numpy(np.concatenate(chunks, axis=0)),
            "image_grid_thw": torch.tensor(grids, dtype=torch.long),
        }

    # -- files ---------------------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        """The ``preprocessor_config.json`` of transformers' ``Kimi_K25ImageProcessor``."""
        out: dict[str, Any] = {
            "image_processor_type": HF_IMAGE_PROCESSOR_TYPE,
            "patch_size": self.patch_size,
            "merge_size": self.merge_size,
            "max_patches": self.max_patches,
            "size": {
                "max_height": self.max_patches_per_side,
                "max_width": self.max_patches_per_side,
            },
            "image_mean": list(self.image_mean),
            "image_std": list(self.image_std),
            "resample": self.resample,
            "do_resize": True,
            "do_rescale": True,
            "rescale_factor": 1 / 255,
            "do_normalize": True,
            "do_convert_rgb": True,
        }
        if self.min_pixels:
            out["min_pixels"] = self.min_pixels
        return out

    def save_pretrained(self, save_directory: str | Path) -> None:
        """Write ``preprocessor_config.json``."""
        out = Path(save_directory)
        out.mkdir(parents=True, exist_ok=True)
        (out / PREPROCESSOR_FILE).write_text(json.dumps(self.to_dict(), indent=2) + "\n")

    @staticmethod
    def settings_from_file(path: str | Path | None) -> dict[str, Any]:
        """Constructor kwargs from ``path/preprocessor_config.json`` (transformers' format or
        the hub's remote-code ``media_proc_cfg``; read as JSON, never executed)."""
        if path is None:
            return {}
        file = Path(path) / PREPROCESSOR_FILE
        if not file.is_file():
            return {}
        saved = json.loads(file.read_text())
        out: dict[str, Any] = {}
        media = saved.get("media_proc_cfg")
        if isinstance(media, Mapping):  # the hub's remote-code processor
            mapping = {
                "in_patch_limit": "max_patches",
                "patch_limit_on_one_side": "max_patches_per_side",
                "image_mean": "image_mean",
                "image_std": "image_std",
            }
            out.update(
                {ours: media[theirs] for theirs, ours in mapping.items() if media.get(theirs)}
            )
            return out
        for key in ("max_patches", "image_mean", "image_std", "resample", "min_pixels"):
            if saved.get(key) is not None:
                out[key] = saved[key]
        size = saved.get("size") or {}
        if size.get("max_height"):
            out["max_patches_per_side"] = size["max_height"]
        return out

    @classmethod
    def build(
        cls,
        *,
        path: str | Path | None,
        patch_size: int,
        merge_size: int,
        min_pixels: int | None = None,
        max_pixels: int | None = None,
    ) -> KimiImageProcessor:
        """Settings from ``path`` when it has a preprocessor config, else the defaults;
        ``[model] min_pixels/max_pixels`` override both; patch and merge sizes always follow
        the model config (so pixels and the vision tower cannot disagree)."""
        kwargs = cls.settings_from_file(path)
        if max_pixels is not None:
            kwargs["max_patches"] = max(1, max_pixels // patch_size**2)
        if min_pixels is not None:
            kwargs["min_pixels"] = min_pixels
        return cls(patch_size=patch_size, merge_size=merge_size, **kwargs)

    def __repr__(self) -> str:
        return (
            f"KimiImageProcessor(patch_size={self.patch_size}, merge_size={self.merge_size}, "
            f"max_patches={self.max_patches}, max_patches_per_side={self.max_patches_per_side}, "
            f"min_pixels={self.min_pixels})"
        )


class KimiProcessor(ImageTextProcessor):
    """Tokenizer + :class:`KimiImageProcessor`, images only.

    Image ``i`` becomes ``<|media_begin|>image<|media_content|>`` + ``<|media_pad|>`` × N +
    ``<|media_end|>`` (:meth:`image_token_ids`). ``__call__`` mirrors the HF processor for
    inference (each ``<|media_pad|>`` of ``text`` is expanded per image).
    """

    image_token = MEDIA_PAD

    def __init__(self, image_processor: KimiImageProcessor, tokenizer: Any) -> None:
        super().__init__(image_processor, tokenizer)
        vocab = tokenizer.get_vocab()
        if MEDIA_PAD not in vocab:
            raise ValueError(f"the tokenizer lacks the Kimi image token {MEDIA_PAD}")
        self.image_token_id = int(vocab[MEDIA_PAD])
        self._prefix_ids = list(tokenizer.encode(IMAGE_PREFIX, add_special_tokens=False))
        self._suffix_ids = list(tokenizer.encode(IMAGE_SUFFIX, add_special_tokens=False))

    def process_images(self, images: Sequence[Image.Image]) -> dict[str, torch.Tensor]:
        """``pixel_values`` and ``image_grid_thw`` of RGB PIL images."""
        return self.image_processor(images)

    def num_image_tokens(self, image_grid_thw: torch.Tensor) -> list[int]:
        """``<|media_pad|>`` tokens per image: ``h·w / merge²`` (t is pooled)."""
        return [int(n) for n in image_grid_thw[:, 1:].prod(dim=-1) // self.merge_size**2]

    def image_token_ids(self, num_tokens: int) -> list[int]:
        """The ids that stand for one image of ``num_tokens`` features."""
        return [*self._prefix_ids, *[self.image_token_id] * num_tokens, *self._suffix_ids]

    def __repr__(self) -> str:
        return f"KimiProcessor({self.image_processor!r}, vocab={len(self.tokenizer)})"


__all__ = [
    "IMAGE_PLACEHOLDER",
    "KimiImageProcessor",
    "KimiProcessor",
    "ResizePlan",
]
