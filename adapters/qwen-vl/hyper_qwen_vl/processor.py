"""A Qwen-VL processor (images and videos) that needs neither torchvision nor the hub.

transformers 5.24 ships two Qwen2-VL image processors: ``Qwen2VLImageProcessor`` (torchvision
backend; without torchvision it warns and falls back) and ``Qwen2VLImageProcessorPil`` (PIL +
numpy). We use the PIL one directly. Qwen3-VL uses the same class with ``patch_size=16``. The
stock ``Qwen2VLProcessor``/``Qwen3VLProcessor`` cannot be built without a video processor
(which needs torchvision), hence :class:`QwenVLProcessor`.

Videos go through the same PIL image processor frame by frame (resize, rescale, normalise,
as transformers' PIL backend does for images), then each run of ``temporal_patch_size``
frames is laid out as one temporal patch exactly like ``Qwen2VLVideoProcessor.patchify``;
the torchvision video processor resizes with torch's bicubic instead of PIL's, so its pixels
differ by resampling only.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import attrs

from hyper_core.adapters.processor import ImageTextProcessor

from .tokens import IMAGE_PAD, VIDEO_PAD, VISION_END, VISION_START
from .video import FrameSampling, read_clip

if TYPE_CHECKING:
    import torch
    from PIL import Image

    from hyper_core.data.conversation import VideoPart
    from hyper_core.data.multimodal import VideoFeatures

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


@attrs.frozen(kw_only=True)
class VideoSettings:
    """A model's video handling: frame sampling, per-frame pixel bounds, and the layout."""

    sampling: FrameSampling
    min_pixels: int
    max_pixels: int
    #: Qwen2.5-VL: give ``second_per_grid_ts`` (seconds per temporal patch) to the model.
    second_per_grid: bool = False
    #: Qwen3-VL: each temporal patch is its own ``<t seconds>`` + vision span.
    timestamps: bool = False


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

    def __init__(
        self,
        image_processor: Any,
        tokenizer: Any,
        chat_template: str | None = None,
        video: VideoSettings | None = None,
    ):
        super().__init__(image_processor, tokenizer)
        factor = (image_processor.patch_size * self.merge_size) ** 2
        self.video = video or VideoSettings(
            sampling=FrameSampling(temporal_patch_size=image_processor.temporal_patch_size),
            min_pixels=128 * factor,
            max_pixels=768 * factor,
        )
        if chat_template is not None:
            tokenizer.chat_template = chat_template
        vocab = tokenizer.get_vocab()
        missing = [t for t in (IMAGE_PAD, VISION_START, VISION_END) if t not in vocab]
        if missing:
            raise ValueError(f"the tokenizer lacks the Qwen-VL special tokens {missing}")
        self.image_token_id = int(vocab[IMAGE_PAD])
        self.vision_start_token_id = int(vocab[VISION_START])
        self.vision_end_token_id = int(vocab[VISION_END])
        self.video_token_id = int(vocab[VIDEO_PAD]) if VIDEO_PAD in vocab else None

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

    # -- videos ----------------------------------------------------------------------------

    def process_videos(self, parts: Sequence[VideoPart]) -> VideoFeatures:
        """``pixel_values_videos`` (float32), ``video_grid_thw`` (int64) and, for Qwen2.5-VL,
        ``second_per_grid_ts`` (float32) of the video parts, and each video's token ids.

        Raises ``SampleError`` (``missing_video``/``corrupt_video``), ``ValueError`` (the image
        processor rejects a frame), ``DataError`` (a video file without PyAV installed).
        """
        import torch

        from hyper_core.data.errors import SampleError
        from hyper_core.data.multimodal import VideoFeatures

        if self.video_token_id is None:
            raise SampleError("bad_format", f"the tokenizer has no {VIDEO_PAD} token")
        settings = self.video
        pixels, grids, seconds, token_ids, counts = [], [], [], [], []
        for part in parts:
            clip = read_clip(part, settings.sampling)
            values, grid = self.video_patches(
                clip.frames,
                min_pixels=part.min_pixels or settings.min_pixels,
                max_pixels=part.max_pixels or settings.max_pixels,
            )
            pixels.append(torch.from_numpy(values))
            grids.append(grid)
            tps = self.image_processor.temporal_patch_size
            seconds.append(tps / clip.sample_fps)
            per_frame = grid[1] * grid[2] // self.merge_size**2
            counts.append(grid[0] * per_frame)
            if settings.timestamps:
                token_ids.append(self._timestamped_ids(clip.indices, clip.source_fps, per_frame))
            else:
                token_ids.append(self.video_token_ids(counts[-1]))
        media = {
            "pixel_values_videos": torch.cat(pixels).float(),
            "video_grid_thw": torch.tensor(grids, dtype=torch.long),
        }
        if settings.second_per_grid:
            media["second_per_grid_ts"] = torch.tensor(seconds, dtype=torch.float32)
        return VideoFeatures(media=media, token_ids=token_ids, token_counts=counts)

    def video_patches(
        self, frames: Sequence[Image.Image], *, min_pixels: int, max_pixels: int
    ) -> tuple[Any, tuple[int, int, int]]:
        """``(Σ patches, C·T·P·P)`` float32 patches and the ``(t, h, w)`` grid of one video.

        Each frame is processed as an image (frames of another size are first resized to the
        first one's); the image processor repeats a frame ``T`` times per patch, so one copy
        per frame is taken and ``T`` consecutive frames fill a patch (the last frame repeated
        up to a multiple of ``T``), in ``Qwen2VLVideoProcessor.patchify``'s order.
        """
        import numpy as np
        from PIL import Image

        if min_pixels > max_pixels:
            raise ValueError(f"video max_pixels {max_pixels} < min_pixels {min_pixels}")
        first = frames[0].size
        frames = [f if f.size == first else f.resize(first, Image.BICUBIC) for f in frames]
        proc = self.image_processor
        out = proc(
            images=list(frames),
            size={"shortest_edge": min_pixels, "longest_edge": max_pixels},
            return_tensors="np",
        )
        _, h, w = (int(v) for v in out["image_grid_thw"][0])
        tps, patch = proc.temporal_patch_size, proc.patch_size
        n = len(frames)
        per = np.asarray(out["pixel_values"], dtype=np.float32)
        per = per.reshape(n, h * w, -1, tps, patch, patch)[:, :, :, 0]  # (n, h·w, C, P, P)
        if pad := -n % tps:
            per = np.concatenate([per, np.repeat(per[-1:], pad, axis=0)])
        t = per.shape[0] // tps
        per = per.reshape(t, tps, h * w, -1, patch, patch).transpose(0, 2, 3, 1, 4, 5)
        return np.ascontiguousarray(per.reshape(t * h * w, -1)), (t, h, w)

    def video_token_ids(self, num_tokens: int) -> list[int]:
        """The ids that stand for one video of ``num_tokens`` features (Qwen2/2.5-VL)."""
        assert self.video_token_id is not None
        return [
            self.vision_start_token_id,
            *[self.video_token_id] * num_tokens,
            self.vision_end_token_id,
        ]

    def _timestamped_ids(self, indices: list[int], fps: float, per_frame: int) -> list[int]:
        """Qwen3-VL: ``<{t:.1f} seconds>`` + a vision span per temporal patch, ``t`` the mean
        time of the patch's first and last frame (``Qwen3VLProcessor._calculate_timestamps``)."""
        tps = self.image_processor.temporal_patch_size
        indices = list(indices) + [indices[-1]] * (-len(indices) % tps)
        ids: list[int] = []
        for k in range(0, len(indices), tps):
            time = (indices[k] / fps + indices[k + tps - 1] / fps) / 2
            ids += self._encode_text(f"<{time:.1f} seconds>")
            ids += self.video_token_ids(per_frame)
        return ids

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
        video: VideoSettings | None = None,
        **image_settings: Any,
    ) -> QwenVLProcessor:
        """Tokenizer and image settings from a local directory (never downloads);
        ``image_settings`` are :func:`build_image_processor`'s keywords but ``path``; ``video``
        the video settings (default: the family-independent defaults of :meth:`__init__`)."""
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(
            str(path), local_files_only=True, trust_remote_code=trust_remote_code
        )
        if chat_template is not None and not getattr(tokenizer, "chat_template", None):
            tokenizer.chat_template = chat_template
        return cls(build_image_processor(path=path, **image_settings), tokenizer, video=video)

    def __repr__(self) -> str:
        return (
            f"QwenVLProcessor(patch_size={self.image_processor.patch_size}, "
            f"merge_size={self.merge_size}, min_pixels={self.min_pixels}, "
            f"max_pixels={self.max_pixels}, vocab={len(self.tokenizer)})"
        )
