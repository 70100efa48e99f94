"""``[model.options]`` of the Qwen-VL adapters (torch-free: ``config validate`` checks them)."""

from __future__ import annotations

import attrs

from hyper_core.config.schema import at_least, meta
from hyper_core.errors import ConfigError


@attrs.frozen(kw_only=True)
class QwenVLOptions:
    """Image budgets in the model's own unit, LLM tokens per image: one token is a
    ``(patch × merge)²`` pixel square (28² for Qwen2/2.5-VL, 32² for Qwen3-VL), so
    ``max_image_tokens = 256`` is ``max_pixels = 256 · 28²`` on Qwen2-VL. They replace
    ``[model] min_pixels``/``max_pixels``, which stay the way to give the bounds in pixels."""

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

    def __attrs_post_init__(self) -> None:
        low, high = self.min_image_tokens, self.max_image_tokens
        if low is not None and high is not None and low > high:
            raise ConfigError([("$.max_image_tokens", f"must be >= min_image_tokens ({low})")])

    def pixel_bounds(
        self, pixels_per_token: int, min_pixels: int | None, max_pixels: int | None
    ) -> tuple[int | None, int | None]:
        """``(min_pixels, max_pixels)`` for the image processor: the token budgets in pixels,
        else ``[model] min_pixels``/``max_pixels``."""
        low = self.min_image_tokens * pixels_per_token if self.min_image_tokens else min_pixels
        high = self.max_image_tokens * pixels_per_token if self.max_image_tokens else max_pixels
        return low, high
