"""Images → ``pixel_values`` with transformers' PIL CLIP processor (no torchvision), and the
``<image>`` token expanded to one token per image feature. Exports load as transformers'
``LlavaProcessor`` (``processor_config.json``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from hyper_core.adapters.processor import ImageTextProcessor

from .tokens import IMAGE_TOKEN


class LlavaProcessor(ImageTextProcessor):
    """Every image is resized and centre-cropped to the tower's size: a fixed token count."""

    image_token = IMAGE_TOKEN
    #: What an export loads as with stock transformers (``AutoProcessor.from_pretrained``).
    processor_class = "LlavaProcessor"

    def __init__(self, image_processor: Any, tokenizer: Any, config: Any) -> None:
        super().__init__(image_processor, tokenizer)
        self.image_token_id = int(tokenizer.convert_tokens_to_ids(IMAGE_TOKEN))
        self.config = config  # the LlavaConfig: tokens per image, the stock processor's settings
        self.tokens_per_image = tokens_per_image(config)

    def processor_fields(self) -> dict[str, Any]:
        """``LlavaProcessor`` counts ``(size // patch_size)²`` patches + CLS, less one under
        the ``default`` feature strategy: the same count as :func:`tokens_per_image`."""
        return {
            "image_token": IMAGE_TOKEN,
            "patch_size": self.config.vision_config.patch_size,
            "num_additional_image_tokens": 1,  # CLIP's CLS
            "vision_feature_select_strategy": self.config.vision_feature_select_strategy,
        }

    def process_images(self, images: Sequence[Any]) -> dict[str, Any]:
        """``pixel_values`` ``(N, 3, S, S)``."""
        return {
            "pixel_values": self.image_processor(list(images), return_tensors="pt")["pixel_values"]
        }

    def image_token_counts(self, media: dict[str, Any]) -> list[int]:
        """The same count for every image (there is no grid)."""
        return [self.tokens_per_image] * len(media["pixel_values"])

    def image_token_ids(self, num_tokens: int) -> list[int]:
        """``<image>`` repeated, as LLaVA's processor expands it."""
        return [self.image_token_id] * num_tokens


def tokens_per_image(config: Any) -> int:
    """Image features per image: patches, plus CLS with the ``full`` feature strategy."""
    vc = config.vision_config
    patches = (vc.image_size // vc.patch_size) ** 2
    return patches + (1 if config.vision_feature_select_strategy == "full" else 0)


def build_image_processor(vision_config: Any, path: str | None) -> Any:
    """``CLIPImageProcessorPil`` from ``path`` when it has a preprocessor config, else sized
    to the tower (the size must match the tower's position table)."""
    from pathlib import Path

    from transformers.models.clip.image_processing_pil_clip import CLIPImageProcessorPil

    size = vision_config.image_size
    if path is not None and (Path(path) / "preprocessor_config.json").is_file():
        return CLIPImageProcessorPil.from_pretrained(path, local_files_only=True)
    return CLIPImageProcessorPil(
        size={"shortest_edge": size}, crop_size={"height": size, "width": size}
    )
