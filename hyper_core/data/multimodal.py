"""The multimodal sample transform shared by VL adapters: conversation → images → tokens.

:func:`tokenize_multimodal` parses a raw sample, loads its images, runs the adapter's
:class:`~hyper_core.adapters.processor.ImageTextProcessor`, renders the chat with each image
expanded to its image tokens, and checks that the text's image tokens match the image
features. Adapters add what is model-specific (e.g. mRoPE position ids) to the result.
Per-image metadata (the processor's ``metadata_keys``) reaches the expansion callback
(``processor.expand_image``) and :attr:`MultimodalTokens.image_metadata`, not the media; its
numeric entries travel as :attr:`SampleFeatures.image_meta
<hyper_core.batching.types.SampleFeatures.image_meta>` to the adapter's vision methods.

Video parts go to the processor's optional ``process_videos(parts) -> VideoFeatures``, which
decodes them and gives their model tensors (e.g. ``pixel_values_videos``) and each video's
token ids; a processor without it takes no video (``bad_format``).
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
class VideoFeatures:
    """A processor's videos of one sample: model tensors and the token ids of each video."""

    #: Concatenated across samples like the image media (e.g. ``pixel_values_videos``).
    media: dict[str, torch.Tensor]
    #: The ids that stand for each video, in order (e.g. ``<|vision_start|>`` + pads + end).
    token_ids: list[list[int]]
    #: The feature (video pad) tokens of each video, in order.
    token_counts: list[int]


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
    #: The numeric metadata as tensors, one row per image
    #: (:attr:`SampleFeatures.image_meta <hyper_core.batching.types.SampleFeatures.image_meta>`).
    image_meta: dict[str, torch.Tensor] = attrs.field(factory=dict)
    #: LLM tokens of each video, in order.
    video_token_counts: list[int] = attrs.field(factory=list)
    #: ``input_ids == processor.video_token_id`` (None when the sample has no video).
    is_video: torch.Tensor | None = None

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
            image_meta=dict(self.image_meta),
            num_videos=len(self.video_token_counts),
            meta=dict(sample.get("meta") or {}),
            **fields,
        )


def tokenize_multimodal(
    sample: Mapping[str, Any],
    processor: ImageTextProcessor,
    chat_format: ChatFormat,
    *,
    max_seq_len: int,
    piecewise: bool = False,
) -> MultimodalTokens:
    """Tokenise a raw conversation sample with images (in one pass, each image as the
    processor's :attr:`~hyper_core.adapters.processor.ImageTextProcessor.image_placeholder`;
    ``piecewise``: the old piece-by-piece path, see
    :func:`~hyper_core.data.chat.tokenize_conversation`).

    Raises :class:`SampleError`: ``bad_format``, ``missing_image``/``corrupt_image``,
    ``bad_image`` (the processor rejects it, e.g. an extreme aspect ratio), ``too_long``
    (never truncated), ``image_token_mismatch`` (the text itself holds image tokens); for
    videos the processor's (``missing_video``/``corrupt_video``, ``bad_video``).
    """
    import torch

    from .chat import check_text_length, tokenize_conversation
    from .conversation import VideoPart, load_images, parse_conversation

    conv = parse_conversation(sample)
    check_text_length(conv, processor.tokenizer, chat_format, max_seq_len)  # before the images
    images = load_images(conv)
    media: dict[str, torch.Tensor] = {}
    counts: list[int] = []
    metadata: list[dict[str, Any]] = []
    meta_tensors: dict[str, torch.Tensor] = {}
    if images:
        try:
            output = dict(processor.process_images(images))
        except ValueError as exc:
            raise SampleError("bad_image", str(exc)) from None
        counts = processor.image_token_counts(output)
        metadata = processor.image_metadata(output, len(counts))
        meta_tensors = processor.metadata_tensors(output)
        media = processor.model_media(output)
    videos = _process_videos(conv.videos, processor)
    if videos is not None:
        media.update(videos.media)
    seen = {"image": 0, "video": 0}

    def image_tokens(_index: int, part: Any) -> Sequence[int]:
        kind = "video" if isinstance(part, VideoPart) else "image"
        i = seen[kind]
        seen[kind] += 1
        if videos is not None and kind == "video":
            return videos.token_ids[i]
        return processor.expand_image(counts[i], metadata[i])

    tok = tokenize_conversation(
        conv,
        processor.tokenizer,
        chat_format,
        image_tokens=image_tokens,
        image_placeholder=processor.image_placeholder if images or videos is not None else None,
        max_seq_len=max_seq_len,
        piecewise=piecewise,
    )
    input_ids = torch.tensor(tok.input_ids, dtype=torch.long)
    is_image = input_ids == processor.image_token_id
    if int(is_image.sum()) != sum(counts):
        raise SampleError(
            "image_token_mismatch",
            f"{int(is_image.sum())} image tokens in the text but {sum(counts)} image features "
            f"({len(counts)} images)",
        )
    is_video = None
    if videos is not None:
        is_video = input_ids == processor.video_token_id  # type: ignore[attr-defined]
        if int(is_video.sum()) != sum(videos.token_counts):
            raise SampleError(
                "image_token_mismatch",
                f"{int(is_video.sum())} video tokens in the text but "
                f"{sum(videos.token_counts)} video features ({len(videos.token_counts)} videos)",
            )
    return MultimodalTokens(
        input_ids=input_ids,
        labels=torch.tensor(tok.labels, dtype=torch.long),
        media=media,
        image_token_counts=counts,
        is_image=is_image,
        image_metadata=metadata,
        image_meta=meta_tensors,
        video_token_counts=[] if videos is None else list(videos.token_counts),
        is_video=is_video,
    )


def _process_videos(parts: Sequence[Any], processor: ImageTextProcessor) -> VideoFeatures | None:
    """The processor's :class:`VideoFeatures` of ``parts`` (None when there are none)."""
    if not parts:
        return None
    process = getattr(processor, "process_videos", None)
    if process is None:
        raise SampleError("bad_format", "sample has a video but the model takes none")
    try:
        result: VideoFeatures = process(parts)
    except ValueError as exc:
        raise SampleError("bad_video", str(exc)) from None
    return result
