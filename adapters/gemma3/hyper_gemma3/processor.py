"""Images → ``pixel_values`` with transformers' PIL Gemma 3 image processor (no torchvision),
and each ``<start_of_image>`` expanded as stock ``Gemma3Processor`` does:
``\\n\\n<start_of_image>`` + ``mm_tokens_per_image`` × ``<image_soft_token>`` +
``<end_of_image>\\n\\n``. Exports load as ``Gemma3Processor`` (``processor_config.json``)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hyper_core.adapters.processor import ImageTextProcessor

from .tokens import BOI, EOI, IMAGE_SOFT

if TYPE_CHECKING:
    from PIL import Image

#: What stock ``Gemma3Processor`` writes around an image's tokens.
IMAGE_MARGIN = "\n\n"


class Gemma3Processor(ImageTextProcessor):
    """Every image is resized to the tower's size: ``mm_tokens_per_image`` soft tokens each."""

    image_token = IMAGE_SOFT
    processor_class = "Gemma3Processor"
    #: The image processor's per-image crop count (0 without pan-and-scan): not a model input.
    metadata_keys = ("num_crops",)

    def __init__(self, image_processor: Any, tokenizer: Any, config: Any) -> None:
        super().__init__(image_processor, tokenizer)
        self.image_token_id = int(tokenizer.convert_tokens_to_ids(IMAGE_SOFT))
        self.boi_token_id = int(tokenizer.convert_tokens_to_ids(BOI))
        self.eoi_token_id = int(tokenizer.convert_tokens_to_ids(EOI))
        self.tokens_per_image = int(config.mm_tokens_per_image)
        self._margin = [int(i) for i in tokenizer.encode(IMAGE_MARGIN, add_special_tokens=False)]

    @property
    def image_placeholder(self) -> str:
        """``<start_of_image>``: what Gemma's chat template writes for an image."""
        return BOI

    def processor_fields(self) -> dict[str, Any]:
        """``Gemma3Processor``'s soft-token count per image."""
        return {"image_seq_length": self.tokens_per_image}

    def process_images(self, images: Sequence[Image.Image]) -> dict[str, Any]:
        """``pixel_values`` ``(N, 3, S, S)`` and the metadata ``num_crops``."""
        out = self.image_processor(list(images), return_tensors="pt")
        return {"pixel_values": out["pixel_values"], "num_crops": out["num_crops"]}

    def image_token_counts(self, media: dict[str, Any]) -> list[int]:
        """``mm_tokens_per_image`` for every image (the tower pools to a fixed grid)."""
        return [self.tokens_per_image] * len(media["pixel_values"])

    def image_token_ids(self, num_tokens: int) -> list[int]:
        """``\\n\\n<start_of_image>`` + soft tokens + ``<end_of_image>\\n\\n``."""
        return [
            *self._margin,
            self.boi_token_id,
            *[self.image_token_id] * num_tokens,
            self.eoi_token_id,
            *self._margin,
        ]

    def extra_features(self, encoded: Any) -> dict[str, Any]:
        """``token_type_ids``: 1 on soft image tokens (they attend to their image both ways)."""
        return {"token_type_ids": (encoded["input_ids"] == self.image_token_id).long()}


def build_image_processor(vision_config: Any, path: str | None) -> Any:
    """``Gemma3ImageProcessorPil`` from ``path`` when it has a preprocessor config, else sized
    to the tower (the size must match the tower's position table)."""
    from transformers.models.gemma3.image_processing_pil_gemma3 import Gemma3ImageProcessorPil

    if path is not None and (Path(path) / "preprocessor_config.json").is_file():
        return Gemma3ImageProcessorPil.from_pretrained(path, local_files_only=True)
    size = int(vision_config.image_size)
    return Gemma3ImageProcessorPil(size={"height": size, "width": size})
