"""``[model.options]`` of the Qwen-VL adapters (torch-free: ``config validate`` checks them)."""

from __future__ import annotations

import attrs

from hyper_core.config.fields import at_least, greater_than, meta
from hyper_core.errors import ConfigError


@attrs.frozen(kw_only=True)
class QwenVLOptions:
    """Image budgets in the model's own unit, LLM tokens per image: one token is a
    ``(patch × merge)²`` pixel square (28² for Qwen2/2.5-VL, 32² for Qwen3-VL), so
    ``max_image_tokens = 256`` is ``max_pixels = 256 · 28²`` on Qwen2-VL. They replace
    ``[model] min_pixels``/``max_pixels``, which stay the way to give the bounds in pixels.

    The ``video_*`` options are the defaults of video parts (a part's own ``fps``,
    ``max_frames``, ``min_pixels``, ``max_pixels`` override them); video pixel bounds are per
    frame."""

    min_image_tokens: int | None = attrs.field(
        default=None,
        validator=at_least(1),
        metadata=meta("Fewest LLM tokens per image (smaller images are scaled up)."),
    )
    max_image_tokens: int | None = attrs.field(
        default=None,
        validator=at_least(1),
        metadata=meta("Most LLM tokens per image (larger images are scaled down)."),
    )

    video_fps: float = attrs.field(
        default=2.0,
        validator=greater_than(0),
        metadata=meta("Frames sampled per second of a video file (a frame list's frame rate)."),
    )
    video_max_frames: int = attrs.field(
        default=768, validator=at_least(2), metadata=meta("Most frames sampled from a video.")
    )
    video_min_pixels: int | None = attrs.field(
        default=None,
        validator=at_least(1),
        metadata=meta("Smallest video frame area after resizing (default 128 tokens' worth)."),
    )
    video_max_pixels: int | None = attrs.field(
        default=None,
        validator=at_least(1),
        metadata=meta("Largest video frame area after resizing (default 768 tokens' worth)."),
    )

    def __attrs_post_init__(self) -> None:
        for name in ("image_tokens", "pixels"):
            key = "" if name == "image_tokens" else "video_"
            low = getattr(self, f"{key}min_{name}")
            high = getattr(self, f"{key}max_{name}")
            if low is not None and high is not None and low > high:
                raise ConfigError([(f"$.{key}max_{name}", f"must be >= {key}min_{name} ({low})")])

    def pixel_bounds(
        self, pixels_per_token: int, min_pixels: int | None, max_pixels: int | None
    ) -> tuple[int | None, int | None]:
        """``(min_pixels, max_pixels)`` for the image processor: the token budgets in pixels,
        else ``[model] min_pixels``/``max_pixels``."""
        low = self.min_image_tokens * pixels_per_token if self.min_image_tokens else min_pixels
        high = self.max_image_tokens * pixels_per_token if self.max_image_tokens else max_pixels
        return low, high

    def video_pixel_bounds(self, pixels_per_token: int) -> tuple[int, int]:
        """``(min, max)`` pixels of a video frame: the options, else 128 and 768 tokens' worth
        (transformers' video processor defaults); one bound given alone moves the other."""
        low, high = self.video_min_pixels, self.video_max_pixels
        if low is None:
            low = min(128 * pixels_per_token, high or 128 * pixels_per_token)
        if high is None:
            high = max(768 * pixels_per_token, low)
        return low, high
