"""An image-only Qwen-VL processor that needs neither torchvision nor the hub.

transformers 5.24 ships two Qwen2-VL image processors: ``Qwen2VLImageProcessor`` (torchvision
backend; without torchvision it warns and falls back) and ``Qwen2VLImageProcessorPil`` (PIL +
numpy). We use the PIL one directly. Qwen3-VL uses the same class with ``patch_size=16``. The
stock ``Qwen2VLProcessor``/``Qwen3VLProcessor`` cannot be built without a video processor
(which needs torchvision), hence :class:`QwenVLProcessor`, which handles images only.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import attrs

from hyper_core.adapters.processor import ImageTextProcessor

from .tokens import IMAGE_PAD, VISION_END, VISION_START

if TYPE_CHECKING:
    import torch
    from PIL import Image

PREPROCESSOR_FILE = "preprocessor_config.json"
#: Keys of a ``preprocessor_config.json`` that carry over (the rest follows the model config).
_CARRIED_KEYS = (
    "size",
    "min_pixels",
    "max_pixels",
    "image_mean",
    "image_std",
    "resample",
    "do_resize",
    "do_rescale",
    "rescale_factor",
    "do_normalize",
    "do_convert_rgb",
)


@attrs.frozen(kw_only=True)
class ImageDefaults:
    """A family's image-processor defaults, used when the model directory has none."""

    min_pixels: int
    max_pixels: int
    image_mean: tuple[float, float, float]
    image_std: tuple[float, float, float]


def build_image_processor(
    *,
    path: str | Path | None,
    patch_size: int,
    merge_size: int,
    temporal_patch_size: int,
    defaults: ImageDefaults,
    min_pixels: int | None = None,
    max_pixels: int | None = None,
) -> Any:
    """A ``Qwen2VLImageProcessorPil`` for the model's vision config.

    Settings come from ``path/preprocessor_config.json`` when there is one, else ``defaults``;
    ``min_pixels``/``max_pixels`` (``[model]``) override both, and one given alone moves the
    other past it (``max_pixels`` below the default least area lowers that too). Patch, merge
    and temporal sizes always follow the model config, so pixels and the vision tower cannot
    disagree.
    """
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import (
        Qwen2VLImageProcessorPil,
    )

    kwargs: dict[str, Any] = {
        "min_pixels": defaults.min_pixels,
        "max_pixels": defaults.max_pixels,
        "image_mean": list(defaults.image_mean),
        "image_std": list(defaults.image_std),
    }
    file = Path(path) / PREPROCESSOR_FILE if path is not None else None
    if file is not None and file.is_file():
        saved = json.loads(file.read_text())
        kwargs = {k: saved[k] for k in _CARRIED_KEYS if k in saved}
    size = dict(kwargs.pop("size", None) or {})
    low = kwargs.pop("min_pixels", None)
    high = kwargs.pop("max_pixels", None)
    size["shortest_edge"] = min_pixels or low or size.get("shortest_edge", defaults.min_pixels)
    size["longest_edge"] = max_pixels or high or size.get("longest_edge", defaults.max_pixels)
    # A bound given alone moves the default other one past it rather than clash with it.
    if max_pixels is not None and min_pixels is None:
        size["shortest_edge"] = min(size["shortest_edge"], max_pixels)
    if min_pixels is not None and max_pixels is None:
        size["longest_edge"] = max(size["longest_edge"], min_pixels)
    if size["shortest_edge"] > size["longest_edge"]:
        from hyper_core.errors import ConfigError

        raise ConfigError(
            [
                (
                    "$.model.max_pixels",
                    f"max_pixels {size['longest_edge']} < min_pixels {size['shortest_edge']}",
                )
            ]
        )
    return Qwen2VLImageProcessorPil(
        size=size,
        patch_size=patch_size,
        merge_size=merge_size,
        temporal_patch_size=temporal_patch_size,
        **kwargs,
    )


class QwenVLProcessor(ImageTextProcessor):
    """Tokenizer + PIL image processor for Qwen-VL models, images only.

    :meth:`process_images` gives ``pixel_values`` ``(Σ patches, C·T·P·P)`` and
    ``image_grid_thw`` ``(num_images, 3)``; image ``i`` becomes
    ``<|vision_start|>`` + ``<|image_pad|>`` × :meth:`num_image_tokens` + ``<|vision_end|>``.
    ``__call__`` mirrors the HF processor for inference (``<|image_pad|>`` in ``text`` is
    expanded per image); ``save_pretrained`` writes the tokenizer, chat template and
    ``preprocessor_config.json``.
    """

    image_token = IMAGE_PAD
    vision_start_token = VISION_START
    vision_end_token = VISION_END

    def __init__(self, image_processor: Any, tokenizer: Any, chat_template: str | None = None):
        super().__init__(image_processor, tokenizer)
        if chat_template is not None:
            tokenizer.chat_template = chat_template
        vocab = tokenizer.get_vocab()
        missing = [t for t in (IMAGE_PAD, VISION_START, VISION_END) if t not in vocab]
        if missing:
            raise ValueError(f"the tokenizer lacks the Qwen-VL special tokens {missing}")
        self.image_token_id = int(vocab[IMAGE_PAD])
        self.vision_start_token_id = int(vocab[VISION_START])
        self.vision_end_token_id = int(vocab[VISION_END])

    @property
    def min_pixels(self) -> int:
        """Smallest resized image area."""
        return int(self.image_processor.size["shortest_edge"])

    @property
    def max_pixels(self) -> int:
        """Largest resized image area."""
        return int(self.image_processor.size["longest_edge"])

    # -- images ----------------------------------------------------------------------------

    def process_images(self, images: Sequence[Image.Image]) -> dict[str, torch.Tensor]:
        """``pixel_values`` (float32) and ``image_grid_thw`` (int64) of RGB PIL images."""
        out = self.image_processor(images=list(images), return_tensors="pt")
        return {
            "pixel_values": out["pixel_values"].float(),
            "image_grid_thw": out["image_grid_thw"].long(),
        }

    def num_image_tokens(self, image_grid_thw: torch.Tensor) -> list[int]:
        """LLM tokens per image: ``t·h·w / merge²``."""
        return [int(n) for n in image_grid_thw.prod(dim=-1) // self.merge_size**2]

    def image_token_ids(self, num_tokens: int) -> list[int]:
        """The ids that stand for one image of ``num_tokens`` features."""
        return [
            self.vision_start_token_id,
            *[self.image_token_id] * num_tokens,
            self.vision_end_token_id,
        ]

    def extra_features(self, encoded: Any) -> dict[str, Any]:
        """``mm_token_type_ids``: 1 on image tokens (read by ``generate``)."""
        return {"mm_token_type_ids": (encoded["input_ids"] == self.image_token_id).long()}

    # -- HF-style API for inference ---------------------------------------------------------

    @classmethod
    def from_pretrained(
        cls,
        path: str | Path,
        *,
        trust_remote_code: bool = False,
        chat_template: str | None = None,
        **image_settings: Any,
    ) -> QwenVLProcessor:
        """Tokenizer and image settings from a local directory (never downloads);
        ``image_settings`` are :func:`build_image_processor`'s keywords but ``path``."""
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(
            str(path), local_files_only=True, trust_remote_code=trust_remote_code
        )
        if chat_template is not None and not getattr(tokenizer, "chat_template", None):
            tokenizer.chat_template = chat_template
        return cls(build_image_processor(path=path, **image_settings), tokenizer)

    def __repr__(self) -> str:
        return (
            f"QwenVLProcessor(patch_size={self.image_processor.patch_size}, "
            f"merge_size={self.merge_size}, min_pixels={self.min_pixels}, "
            f"max_pixels={self.max_pixels}, vocab={len(self.tokenizer)})"
        )
