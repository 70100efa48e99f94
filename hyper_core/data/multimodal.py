"""The multimodal sample transform shared by VL adapters: conversation → images → tokens.

:func:`tokenize_multimodal` parses a raw sample, loads its images, runs the adapter's
:class:`~hyper_core.adapters.processor.ImageTextProcessor`, renders the chat with each image
expanded to its image tokens, and checks that the text's image tokens match the image
features. Adapters add what is model-specific (e.g. mRoPE position ids) to the result.
Per-image metadata (the processor's ``metadata_keys``) reaches the expansion callback
(``processor.expand_image``) and :attr:`MultimodalTokens.image_metadata`, not the media.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import attrs

from ..batching.types import SampleFeatures
from .errors import SampleError

if TYPE_CHECKING:
    import torch

    from ..adapters.processor import ImageTextProcessor
    from .chat import ChatFormat


@attrs.frozen(kw_only=True)
class MultimodalTokens:
    """A tokenised multimodal sample: ids, shifted labels and the processor's image tensors."""

    input_ids: torch.Tensor
    labels: torch.Tensor
    #: The processor's tensors (``pixel_values``, grids...), concatenated across samples.
    media: dict[str, torch.Tensor]
    #: LLM tokens of each image, in order.
    image_token_counts: list[int]
    #: ``input_ids == processor.image_token_id``.
    is_image: torch.Tensor
    #: Each image's metadata (``processor.metadata_keys``; empty mappings when none): not a
    #: model input, for the adapter's own fields (``HFModelAdapter.sample_fields``).
    image_metadata: list[dict[str, Any]] = attrs.field(factory=list)

    @property
    def num_images(self) -> int:
        """Images in the sample."""
        return len(self.image_token_counts)

    def features(self, sample: Mapping[str, Any], **fields: Any) -> SampleFeatures:
        """:class:`SampleFeatures` of these tokens (``fields``: position_ids, token_fields)."""
        return SampleFeatures(
            input_ids=self.input_ids,
            labels=self.labels,
            media=self.media,
            num_images=self.num_images,
            meta=dict(sample.get("meta") or {}),
            **fields,
        )


def tokenize_multimodal(
    sample: Mapping[str, Any],
    processor: ImageTextProcessor,
    chat_format: ChatFormat,
    *,
    max_seq_len: int,
) -> MultimodalTokens:
    """Tokenise a raw conversation sample with images.

    Raises :class:`SampleError`: ``bad_format``, ``missing_image``/``corrupt_image``,
    ``bad_image`` (the processor rejects it, e.g. an extreme aspect ratio), ``too_long``
    (never truncated), ``image_token_mismatch`` (the text itself holds image tokens).
    """
    import torch

    from .chat import check_text_length, tokenize_conversation
    from .conversation import load_images, parse_conversation

    conv = parse_conversation(sample)
    check_text_length(conv, processor.tokenizer, chat_format, max_seq_len)  # before the images
    images = load_images(conv)
    media: dict[str, torch.Tensor] = {}
    counts: list[int] = []
    metadata: list[dict[str, Any]] = []
    if images:
        try:
            output = dict(processor.process_images(images))
        except ValueError as exc:
            raise SampleError("bad_image", str(exc)) from None
        counts = processor.image_token_counts(output)
        metadata = processor.image_metadata(output, len(counts))
        media = processor.model_media(output)

    def image_tokens(index: int, _part: Any) -> Sequence[int]:
        return processor.expand_image(counts[index], metadata[index])

    tok = tokenize_conversation(
        conv, processor.tokenizer, chat_format, image_tokens=image_tokens, max_seq_len=max_seq_len
    )
    input_ids = torch.tensor(tok.input_ids, dtype=torch.long)
    is_image = input_ids == processor.image_token_id
    if int(is_image.sum()) != sum(counts):
        raise SampleError(
            "image_token_mismatch",
            f"{int(is_image.sum())} image tokens in the text but {sum(counts)} image features "
            f"({len(counts)} images)",
        )
    return MultimodalTokens(
        input_ids=input_ids,
        labels=torch.tensor(tok.labels, dtype=torch.long),
        media=media,
        image_token_counts=counts,
        is_image=is_image,
        image_metadata=metadata,
    )
