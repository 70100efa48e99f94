"""Images → ``pixel_values`` with transformers' PIL Gemma 3 image processor (no torchvision),
and each ``<start_of_image>`` expanded as stock ``Gemma3Processor`` does:
``\\n\\n<start_of_image>`` + ``mm_tokens_per_image`` × ``<image_soft_token>`` +
``<end_of_image>\\n\\n``; with pan-and-scan crops, ``Here is the original image`` + that block +
``and here are some crops to help you see better`` + one block per crop. Exports load as
``Gemma3Processor`` (``processor_config.json``)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hyper_core.adapters.processor import ImageTextProcessor

from .options import Gemma3Options
from .tokens import BOI, EOI, IMAGE_SOFT

if TYPE_CHECKING:
    from PIL import Image

#: What stock ``Gemma3Processor`` writes around an image's tokens.
IMAGE_MARGIN = "\n\n"
#: Stock ``Gemma3Processor``'s text around an image with pan-and-scan crops: before the
#: original's block, between it and the crops' blocks, and between two crops' blocks.
CROPS_INTRO = "Here is the original image "
CROPS_LEAD = " and here are some crops to help you see better "
CROPS_SEPARATOR = " "
#: The per-image metadata key of tiles the tower sees: the original plus its crops.
NUM_TILES = "num_tiles"


class Gemma3Processor(ImageTextProcessor):
    """Every image (and crop) is resized to the tower's size: ``mm_tokens_per_image`` soft
    tokens each."""

    image_token = IMAGE_SOFT
    processor_class = "Gemma3Processor"
    #: The image processor's per-image crop count (0 without pan-and-scan) and the tiles the
    #: tower sees (``1 + num_crops``, the adapter's ``vision_tile_key``): not model inputs.
    metadata_keys = ("num_crops", NUM_TILES)

    def __init__(self, image_processor: Any, tokenizer: Any, config: Any) -> None:
        super().__init__(image_processor, tokenizer)
        self.image_token_id = int(tokenizer.convert_tokens_to_ids(IMAGE_SOFT))
        self.boi_token_id = int(tokenizer.convert_tokens_to_ids(BOI))
        self.eoi_token_id = int(tokenizer.convert_tokens_to_ids(EOI))
        self.tokens_per_image = int(config.mm_tokens_per_image)
        self._margin = self._encode_text(IMAGE_MARGIN)
        self._crops_text = [self._encode_text(t) for t in (CROPS_INTRO, CROPS_LEAD)]
        self._crops_separator = self._encode_text(CROPS_SEPARATOR)

    @property
    def image_placeholder(self) -> str:
        """``<start_of_image>``: what Gemma's chat template writes for an image."""
        return BOI

    def processor_fields(self) -> dict[str, Any]:
        """``Gemma3Processor``'s soft-token count per image (pan-and-scan is the image
        processor's, saved in ``preprocessor_config.json``)."""
        return {"image_seq_length": self.tokens_per_image}

    def process_images(self, images: Sequence[Image.Image]) -> dict[str, Any]:
        """``pixel_values`` ``(Σ (1 + crops), 3, S, S)`` (each image, then its crops) and the
        metadata ``num_crops`` and ``num_tiles``."""
        import torch

        out = self.image_processor(list(images), return_tensors="pt")
        crops = torch.as_tensor(out["num_crops"], dtype=torch.long)
        return {"pixel_values": out["pixel_values"], "num_crops": crops, NUM_TILES: crops + 1}

    def image_token_counts(self, media: Mapping[str, Any]) -> list[int]:
        """``mm_tokens_per_image`` per tile: the image and each of its ``num_crops``."""
        return [self.tokens_per_image * (1 + int(n)) for n in media["num_crops"]]

    def image_token_ids(self, num_tokens: int) -> list[int]:
        """``\\n\\n<start_of_image>`` + soft tokens + ``<end_of_image>\\n\\n``."""
        return [
            *self._margin,
            self.boi_token_id,
            *[self.image_token_id] * num_tokens,
            self.eoi_token_id,
            *self._margin,
        ]

    def expand_image(self, num_tokens: int, metadata: Mapping[str, Any]) -> list[int]:
        """One block without crops; with ``num_crops`` crops, stock ``Gemma3Processor``'s text
        with the original's block and then one block per crop."""
        crops = int(metadata["num_crops"])
        if not crops:
            return self.image_token_ids(num_tokens)
        block = self.image_token_ids(num_tokens // (1 + crops))
        intro, lead = self._crops_text
        ids = [*intro, *block, *lead, *block]
        for _ in range(crops - 1):
            ids += [*self._crops_separator, *block]
        return ids

    def extra_features(self, encoded: Any) -> dict[str, Any]:
        """``token_type_ids``: 1 on soft image tokens (they attend to their image both ways)."""
        return {"token_type_ids": (encoded["input_ids"] == self.image_token_id).long()}


def build_image_processor(vision_config: Any, path: str | None, options: Gemma3Options) -> Any:
    """``Gemma3ImageProcessorPil`` from ``path`` when it has a preprocessor config, else sized
    to the tower (the size must match the tower's position table); pan-and-scan as the
    ``options`` say (saved with it, so an export crops as training did)."""
    from transformers.models.gemma3.image_processing_pil_gemma3 import Gemma3ImageProcessorPil

    settings = options.image_processor_settings()
    if path is not None and (Path(path) / "preprocessor_config.json").is_file():
        return Gemma3ImageProcessorPil.from_pretrained(path, local_files_only=True, **settings)
    size = int(vision_config.image_size)
    return Gemma3ImageProcessorPil(size={"height": size, "width": size}, **settings)
