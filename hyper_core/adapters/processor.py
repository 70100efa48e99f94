"""A base for image + text processors of VL adapters (images only, offline, no torchvision).

Subclasses set :attr:`image_token` (the token repeated per image feature) and
``image_token_id``, and implement :meth:`process_images`, :meth:`num_image_tokens` (or
:meth:`image_token_counts` when there is no ``image_grid_thw``) and :meth:`image_token_ids`;
:func:`hyper_core.data.multimodal.tokenize_multimodal` uses them, and this class gives
the HF-processor-like API used for inference and export: ``__call__``, ``apply_chat_template``,
``decode``/``batch_decode`` and ``save_pretrained``.

An export is usable with stock transformers (``AutoProcessor.from_pretrained``) when the
subclass names the stock processor in :attr:`processor_class` and gives its settings in
:meth:`processor_fields` (written to ``processor_config.json``), and the tokenizer's chat
template emits :attr:`image_placeholder` for an image part
(:meth:`ChatFormat.template(image=...) <hyper_core.data.chat.ChatFormat.template>`).
:func:`hyper_core.testing.conformance.check_stock_inference` checks both.

Per-image metadata: what :meth:`process_images` returns under :attr:`metadata_keys` (one entry
per image, e.g. a tile grid's ``rows`` and ``cols`` or a tile count) is not a model input. It
reaches :meth:`image_token_counts` (with the rest of the output), the expansion callback
:meth:`expand_image` (one image's entries) and, when numeric, the adapter's vision methods
(:meth:`metadata_tensors`, carried as the micro-batch's ``image_meta``), never the model.

Media layout: a micro-batch's media are each key's tensors concatenated along dim 0 across its
samples (and :meth:`HFModelAdapter.split_vision_inputs
<hyper_core.adapters.hf.HFModelAdapter.split_vision_inputs>` cuts them per image). For a
variable number of tiles per image, put the tiles along dim 0 (``pixel_values``
``(Σ tiles, C, H, W)``), not padded to the largest tile count, and give each image's tile
count or grid in a ``(num_images, k)`` int tensor when the model's forward takes it (as
Qwen-VL's ``image_grid_thw``), else as metadata (InternVL's ``num_patches``: the tile-based
defaults of :class:`~hyper_core.adapters.hf.HFModelAdapter` read it); a model that wants
``(images, max_tiles, ...)`` gets it from the adapter's forward, not from the data.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

if TYPE_CHECKING:
    import torch
    from PIL import Image


#: The file ``AutoProcessor.from_pretrained`` reads the processor class and settings from.
PROCESSOR_CONFIG_FILE = "processor_config.json"


class ImageTextProcessor:
    """Tokenizer + image processor; :attr:`image_placeholder` in a text is expanded per image."""

    image_token: ClassVar[str] = ""
    #: The id of the token repeated per image feature (set by subclasses).
    image_token_id: int
    #: The stock transformers processor an export loads as (e.g. ``"LlavaProcessor"``), or
    #: None when transformers has none (then exports hold no ``processor_config.json``).
    processor_class: ClassVar[str | None] = None
    #: Keys of :meth:`process_images`' output that hold per-image metadata, one entry per
    #: image (a list or a tensor's rows), not model inputs (see the module docstring).
    metadata_keys: ClassVar[tuple[str, ...]] = ()

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

    def process_images(self, images: Sequence[Image.Image]) -> dict[str, Any]:
        """The model's image tensors (e.g. ``pixel_values`` and ``image_grid_thw``) of RGB PIL
        images, plus any per-image metadata under :attr:`metadata_keys`."""
        raise NotImplementedError

    def model_media(self, output: Mapping[str, Any]) -> dict[str, torch.Tensor]:
        """The model inputs of :meth:`process_images`' output (metadata left out)."""
        return {k: v for k, v in output.items() if k not in self.metadata_keys}

    def image_metadata(self, output: Mapping[str, Any], num_images: int) -> list[dict[str, Any]]:
        """One mapping of :attr:`metadata_keys` per image (empty mappings when there are none).

        Raises ``ValueError`` when a key does not hold one entry per image.
        """
        for key in self.metadata_keys:
            if key not in output or len(output[key]) != num_images:
                have = len(output[key]) if key in output else "no"
                raise ValueError(f"metadata {key!r}: {have} entries for {num_images} images")
        return [{k: output[k][i] for k in self.metadata_keys} for i in range(num_images)]

    def metadata_tensors(self, output: Mapping[str, Any]) -> dict[str, torch.Tensor]:
        """The numeric :attr:`metadata_keys` entries of :meth:`process_images`' output as
        tensors with one row per image: they travel with the micro-batch
        (:attr:`~hyper_core.batching.types.MicroBatch.image_meta`) to the adapter's vision
        methods. Entries that are no numbers (strings) stay behind."""
        import torch

        out = {}
        for key in self.metadata_keys:
            try:
                value = torch.as_tensor(output[key])
            except (TypeError, ValueError, RuntimeError):
                continue
            if value.dim():
                out[key] = value
        return out

    def num_image_tokens(self, image_grid_thw: torch.Tensor) -> list[int]:
        """LLM tokens per image."""
        raise NotImplementedError

    def image_token_counts(self, media: dict[str, Any]) -> list[int]:
        """Image features (``image_token`` ids) per image of :meth:`process_images`' output,
        metadata included (default: from ``image_grid_thw``)."""
        return self.num_image_tokens(media["image_grid_thw"])

    def image_token_ids(self, num_tokens: int) -> list[int]:
        """The ids that stand for one image of ``num_tokens`` features."""
        raise NotImplementedError

    def expand_image(self, num_tokens: int, metadata: Mapping[str, Any]) -> Sequence[int]:
        """The expansion callback, used by training and :meth:`__call__`: the ids of one image
        of ``num_tokens`` features and its :attr:`metadata_keys` entries (e.g. a tile grid
        with row and column markers); it holds ``num_tokens`` ``image_token`` ids (training
        checks this). Default: :meth:`image_token_ids`."""
        return self.image_token_ids(num_tokens)

    @property
    def image_placeholder(self) -> str:
        """The text that stands for one image in a prompt, before expansion: the tokens of a
        one-feature image (``<image>``; Qwen-VL ``<|vision_start|><|image_pad|><|vision_end|>``).

        Override it when :meth:`image_token_ids` is not of that shape (e.g. a tile grid).
        """
        ids = self.image_token_ids(1)
        return self.tokenizer.decode(
            ids, skip_special_tokens=False, clean_up_tokenization_spaces=False
        )

    def processor_fields(self) -> dict[str, Any]:
        """The stock processor's settings written to ``processor_config.json`` with
        :attr:`processor_class` (e.g. LLaVA's ``patch_size``, Idefics3's ``image_seq_len``)."""
        return {}

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
        """Tokenise ``text`` (one or a batch) with each :attr:`image_placeholder` replaced by
        :meth:`expand_image` of the next image, as training does (each text in one pass, the
        placeholders' tokens replaced; piece by piece between placeholders for a tokenizer
        without offsets); metadata is left out."""
        from transformers import BatchFeature

        from ..data.chat import has_offsets, tokenize_rendered

        texts = [text] if isinstance(text, str) else list(text)
        data: dict[str, Any] = {}
        counts: list[int] = []
        metadata: list[dict[str, Any]] = []
        if images:
            vision = self.process_images(images)
            data.update(self.model_media(vision))
            counts = self.image_token_counts(vision)
            metadata = self.image_metadata(vision, len(counts))
        placeholder = self.image_placeholder
        idx = 0
        batch: list[list[int]] = []
        for t in texts:
            if has_offsets(self.tokenizer):
                found = find_placeholders(t, placeholder)
                if idx + len(found) > len(counts):
                    raise ValueError(
                        f"more {placeholder!r} in the text than images ({len(counts)})"
                    )
                start = idx

                def expand(k: int, _part: Any, start: int = start) -> Sequence[int]:
                    return self.expand_image(counts[start + k], metadata[start + k])

                ids, _, _ = tokenize_rendered(self.tokenizer, t, [], found, expand)
                idx += len(found)
                batch.append(ids)
                continue
            first, *rest = t.split(placeholder)
            ids = self._encode_text(first)
            for piece in rest:
                if idx >= len(counts):
                    raise ValueError(
                        f"more {placeholder!r} in the text than images ({len(counts)})"
                    )
                ids += [int(i) for i in self.expand_image(counts[idx], metadata[idx])]
                ids += self._encode_text(piece)
                idx += 1
            batch.append(ids)
        if idx != len(counts):
            raise ValueError(f"{len(counts)} images but {idx} {placeholder!r} in the text")
        enc = self.tokenizer.pad(
            {"input_ids": batch}, padding=padding, return_tensors=return_tensors
        )
        data.update(enc)
        data.update(self.extra_features(enc))
        return BatchFeature(data=data)

    def _encode_text(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False)) if text else []

    def batch_decode(self, *args: Any, **kwargs: Any) -> list[str]:
        """The tokenizer's ``batch_decode``."""
        return self.tokenizer.batch_decode(*args, **kwargs)

    def decode(self, *args: Any, **kwargs: Any) -> str:
        """The tokenizer's ``decode``."""
        return self.tokenizer.decode(*args, **kwargs)

    def save_pretrained(self, save_directory: str | Path) -> None:
        """Write the tokenizer files (with the chat template), the image settings and, with a
        :attr:`processor_class`, ``processor_config.json`` (what ``AutoProcessor`` reads)."""
        out = Path(save_directory)
        out.mkdir(parents=True, exist_ok=True)
        self.tokenizer.save_pretrained(str(out))
        self.image_processor.save_pretrained(str(out))
        if self.processor_class is not None:
            fields = {"processor_class": self.processor_class, **self.processor_fields()}
            text = json.dumps(fields, indent=2, sort_keys=True) + "\n"
            (out / PROCESSOR_CONFIG_FILE).write_text(text)


def find_placeholders(text: str, placeholder: str) -> list[tuple[int, int, None]]:
    """The character spans of ``placeholder`` in ``text``, left to right, not overlapping."""
    spans: list[tuple[int, int, None]] = []
    at = text.find(placeholder)
    while placeholder and at >= 0:
        spans.append((at, at + len(placeholder), None))
        at = text.find(placeholder, at + len(placeholder))
    return spans
