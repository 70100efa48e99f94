"""A base for image + text processors of VL adapters (images only, offline, no torchvision).

Subclasses set :attr:`image_token` (the placeholder expanded per image) and
``image_token_id``, and implement :meth:`process_images`, :meth:`num_image_tokens` (or
:meth:`image_token_counts` when there is no ``image_grid_thw``) and :meth:`image_token_ids`;
:func:`hyper_core.data.multimodal.tokenize_multimodal` uses them, and this class gives
the HF-processor-like API used for inference and export: ``__call__``, ``apply_chat_template``,
``decode``/``batch_decode`` and ``save_pretrained``.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

if TYPE_CHECKING:
    import torch
    from PIL import Image


class ImageTextProcessor:
    """Tokenizer + image processor; ``image_token`` in a text is expanded per image."""

    image_token: ClassVar[str] = ""
    #: The id of the token repeated per image feature (set by subclasses).
    image_token_id: int

    def __init__(self, image_processor: Any, tokenizer: Any) -> None:
        self.image_processor = image_processor
        self.tokenizer = tokenizer

    @property
    def chat_template(self) -> str | None:
        """The tokenizer's chat template."""
        return getattr(self.tokenizer, "chat_template", None)

    @property
    def merge_size(self) -> int:
        """Spatial merge of the vision tower (2: 2×2 patches per LLM token)."""
        return int(self.image_processor.merge_size)

    def process_images(self, images: Sequence[Image.Image]) -> dict[str, torch.Tensor]:
        """``pixel_values`` and ``image_grid_thw`` of RGB PIL images."""
        raise NotImplementedError

    def num_image_tokens(self, image_grid_thw: torch.Tensor) -> list[int]:
        """LLM tokens per image."""
        raise NotImplementedError

    def image_token_counts(self, media: dict[str, torch.Tensor]) -> list[int]:
        """LLM tokens per image of :meth:`process_images`' output (from ``image_grid_thw``)."""
        return self.num_image_tokens(media["image_grid_thw"])

    def image_token_ids(self, num_tokens: int) -> list[int]:
        """The ids that stand for one image of ``num_tokens`` features."""
        raise NotImplementedError

    def extra_features(self, encoded: Any) -> dict[str, Any]:
        """Model inputs derived from the token ids (e.g. ``mm_token_type_ids``)."""
        return {}

    def apply_chat_template(self, messages: list[dict[str, Any]], **kwargs: Any) -> Any:
        """The tokenizer's ``apply_chat_template`` (``tokenize=False`` by default)."""
        kwargs.setdefault("tokenize", False)
        return self.tokenizer.apply_chat_template(messages, **kwargs)

    def __call__(
        self,
        text: str | Sequence[str],
        images: Sequence[Image.Image] | None = None,
        *,
        padding: bool | str = False,
        return_tensors: str = "pt",
    ) -> Any:
        """Tokenise ``text`` (one or a batch) with each image token expanded, in order."""
        from transformers import BatchFeature

        texts = [text] if isinstance(text, str) else list(text)
        data: dict[str, Any] = {}
        counts: list[int] = []
        if images:
            vision = self.process_images(images)
            data.update(vision)
            counts = self.image_token_counts(vision)
        idx = 0
        expanded = []
        for t in texts:
            first, *rest = t.split(self.image_token)
            pieces = [first]
            for piece in rest:
                if idx >= len(counts):
                    raise ValueError("more image tokens in the text than images")
                pieces.append(self.image_token * counts[idx] + piece)
                idx += 1
            expanded.append("".join(pieces))
        if idx != len(counts):
            raise ValueError(f"{len(counts)} images but {idx} image tokens in the text")
        enc = self.tokenizer(
            expanded, padding=padding, return_tensors=return_tensors, add_special_tokens=False
        )
        data.update(enc)
        data.update(self.extra_features(enc))
        return BatchFeature(data=data)

    def batch_decode(self, *args: Any, **kwargs: Any) -> list[str]:
        """The tokenizer's ``batch_decode``."""
        return self.tokenizer.batch_decode(*args, **kwargs)

    def decode(self, *args: Any, **kwargs: Any) -> str:
        """The tokenizer's ``decode``."""
        return self.tokenizer.decode(*args, **kwargs)

    def save_pretrained(self, save_directory: str | Path) -> None:
        """Write the tokenizer files (with the chat template) and the image settings."""
        out = Path(save_directory)
        out.mkdir(parents=True, exist_ok=True)
        self.tokenizer.save_pretrained(str(out))
        self.image_processor.save_pretrained(str(out))
