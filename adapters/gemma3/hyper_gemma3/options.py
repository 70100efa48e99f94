"""``[model.options]`` of the Gemma 3 adapter (torch-free: ``config validate`` checks them)."""

from __future__ import annotations

from typing import Any

import attrs

from hyper_core.config.fields import at_least, greater_than, meta


@attrs.frozen(kw_only=True)
class Gemma3Options:
    """Pan-and-scan, as transformers' ``Gemma3ImageProcessor`` does it: an image whose aspect
    ratio reaches ``pan_and_scan_min_ratio_to_activate`` is also cut into 2 to
    ``pan_and_scan_max_num_crops`` crops along its long side (none smaller than
    ``pan_and_scan_min_crop_size`` pixels); the tower sees the original and every crop, each
    ``mm_tokens_per_image`` soft tokens in the text."""

    pan_and_scan: bool = attrs.field(
        default=False, metadata=meta("Add pan-and-scan crops of wide or tall images.")
    )
    pan_and_scan_min_crop_size: int = attrs.field(
        default=256, validator=at_least(1), metadata=meta("Smallest crop side, in pixels.")
    )
    pan_and_scan_max_num_crops: int = attrs.field(
        default=4, validator=at_least(2), metadata=meta("Most crops per image.")
    )
    pan_and_scan_min_ratio_to_activate: float = attrs.field(
        default=1.2,
        validator=greater_than(0),
        metadata=meta("Aspect ratio (long side / short side) from which an image is cropped."),
    )

    def image_processor_settings(self) -> dict[str, Any]:
        """The image processor's pan-and-scan attributes (as saved with an export)."""
        return {
            "do_pan_and_scan": self.pan_and_scan,
            "pan_and_scan_min_crop_size": self.pan_and_scan_min_crop_size,
            "pan_and_scan_max_num_crops": self.pan_and_scan_max_num_crops,
            "pan_and_scan_min_ratio_to_activate": self.pan_and_scan_min_ratio_to_activate,
        }
