"""A pair's prompt images, encoded once for both of its sequences.

Both replies of a pair follow the same prompt, so both sequences hold the same images. The
batching (:class:`~hyper_preference.batching.PairBatching`) then keeps the patches of the
chosen side only (the per-image metadata, e.g. ``image_grid_thw``, of both) and adds two host
lists to the model inputs: :data:`ROWS_KEY`, the images (rows of the metadata) whose patches
are present, and :data:`ORDER_KEY`, for every image of the micro-batch in token order, which of
those it is. :class:`SharedImages`, a forward pre-hook on the model, runs the vision encoder on
the present images through the adapter's documented per-image view
(:class:`~hyper_core.types.VisionEncoderAdapter`: ``call_vision_encoder``, then
``inject_vision_outputs`` with the outputs repeated in token order), so the tower runs once per
pair and its gradient is the sum of both sequences'.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import attrs

if TYPE_CHECKING:
    import torch

    from hyper_core.adapters.base import VisionEncoderSpec
    from hyper_core.batching.types import SampleFeatures

ROWS_KEY = "preference_image_rows"
ORDER_KEY = "preference_image_order"


def share_images(
    sequences: Sequence[SampleFeatures], spec: VisionEncoderSpec
) -> tuple[list[SampleFeatures], dict[str, list[int]]] | None:
    """The pairs' ``sequences`` (chosen, rejected, chosen, ...) with each rejected side's
    patches left out, and the two model-input lists; None when nothing is shared (no images,
    videos, or sides whose images differ)."""
    import torch

    pixels = spec.input_keys[0]
    if any(f.num_videos for f in sequences) or not any(f.num_images for f in sequences):
        return None
    out: list[SampleFeatures] = []
    lists: dict[str, list[int]] = {ROWS_KEY: [], ORDER_KEY: []}
    for chosen, rejected in zip(sequences[0::2], sequences[1::2], strict=True):
        none = torch.empty(0)
        if chosen.num_images != rejected.num_images or not torch.equal(
            chosen.media.get(pixels, none), rejected.media.get(pixels, none)
        ):
            return None
        n = chosen.num_images
        add_present(lists, n)
        lists[ORDER_KEY].extend(lists[ORDER_KEY][len(lists[ORDER_KEY]) - n :] if n else [])
        kept = {k: v for k, v in rejected.media.items() if k != pixels}
        out += [chosen, attrs.evolve(rejected, media=kept)]
    return out, lists


def add_present(lists: dict[str, list[int]], n: int) -> None:
    """``n`` more images whose patches are present (a chosen side's, or the vision filler's)."""
    rows, order = lists[ROWS_KEY], lists[ORDER_KEY]
    first = len(rows)
    rows.extend(range(len(order), len(order) + n))
    order.extend(range(first, first + n))


class SharedImages:
    """The forward pre-hook that encodes the present images once and repeats their outputs."""

    def __init__(self, adapter: Any, spec: VisionEncoderSpec) -> None:
        self.adapter = adapter
        self.pixels, self.grid = spec.input_keys[0], spec.input_keys[1]
        #: Images the tower encoded and the images the language model received (a count).
        self.encoded = 0
        self.received = 0

    def install(self, model: torch.nn.Module) -> Any:
        """Register on ``model`` (returns the hook handle)."""
        return model.register_forward_pre_hook(self, with_kwargs=True)

    def __call__(
        self, module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> tuple[tuple[Any, ...], dict[str, Any]] | None:
        import torch

        from hyper_core.adapters.vision_context import VisionContext
        from hyper_core.adapters.vision_outputs import FlatOutputs

        rows, order = kwargs.pop(ROWS_KEY, None), kwargs.pop(ORDER_KEY, None)
        if rows is None or order is None:
            return None
        grid = kwargs[self.grid]
        index = torch.tensor(rows, dtype=torch.long).to(grid.device, non_blocking=True)
        present = {self.pixels: kwargs[self.pixels], self.grid: grid.index_select(0, index)}
        # a grid tower's metadata is a model input (``image_grid_thw``): no image_meta
        context = VisionContext(config=module.config)
        outputs = self.adapter.call_vision_encoder(module, present, context)
        flat = FlatOutputs(outputs, len(rows))
        repeated = flat.rebuild([[leaf[j] for leaf in flat.leaves] for j in order])
        self.encoded += len(rows)
        self.received += len(order)
        return args, self.adapter.inject_vision_outputs(kwargs, repeated, context)
