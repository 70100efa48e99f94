"""The batching runtime extension point."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, ClassVar

import attrs

from .types import MicroBatch, SampleFeatures

if TYPE_CHECKING:
    import torch


@attrs.frozen(kw_only=True)
class BatchingOptions:
    """What a runtime needs to know to lay out micro-batches."""

    micro_batch_size: int  # samples per micro-batch
    max_seq_len: int
    pad_token_id: int
    pad_to_multiple_of: int = 1
    #: Give packed micro-batches each sample's boundaries as ``cu_seq_lens_q``/``cu_seq_lens_k``
    #: (int32, cumulative) and ``max_length_q``/``max_length_k`` (int) model inputs, for varlen
    #: attention (``varlen``, ``flash_attention_2``...). Off, models that ignore them never
    #: see them.
    varlen_kwargs: bool = False
    #: A sample with one small image (and a small video when the model takes videos) and no
    #: loss, added to every micro-batch that lacks images or videos (see
    #: :meth:`BatchingRuntime.with_filler`). Set when several ranks train a VL model: each
    #: rank's forward then runs the vision encoder, so DDP/FSDP collectives stay in step. None
    #: when one rank trains, or when a per-run plugin object runs the encoder on every rank
    #: itself (``runs_vision_encoder_on_every_rank``, see the ``build_callbacks`` hook).
    vision_filler: SampleFeatures | None = attrs.field(default=None, eq=False, repr=False)


def needs_filler(group: Sequence[SampleFeatures], filler: SampleFeatures) -> bool:
    """Whether ``group`` lacks images or videos that ``filler`` has.

    A VL model runs its vision tower once per kind of media present (images, then videos), so
    with the filler appended every micro-batch of every rank runs it the same number of times
    and the ranks' DDP/FSDP collectives stay in step."""
    images = filler.num_images > 0 and not any(f.num_images for f in group)
    videos = filler.num_videos > 0 and not any(f.num_videos for f in group)
    return images or videos


class BatchingRuntime:
    """Turns one rank's samples for a step into micro-batches and moves them to the device.

    Subclasses implement :meth:`make_micro_batch`; registered with
    ``register_batching_runtimes``. A runtime is constructed as ``Runtime(options)``.
    """

    name: ClassVar[str] = ""

    def __init__(self, options: BatchingOptions) -> None:
        self.options = options
        #: ``options.vision_filler``, fixed when the run builds its runtime.
        self.vision_filler: SampleFeatures | None = options.vision_filler

    def split(self, features: Sequence[SampleFeatures]) -> list[list[SampleFeatures]]:
        """Group a step's samples into micro-batches (default: ``micro_batch_size`` each)."""
        size = self.options.micro_batch_size
        return [list(features[i : i + size]) for i in range(0, len(features), size)]

    def collate(self, features: Sequence[SampleFeatures]) -> list[MicroBatch]:
        """The micro-batches of one step."""
        return [self.with_filler(group) for group in self.split(features) if group]

    def with_filler(self, group: list[SampleFeatures]) -> MicroBatch:
        """:meth:`make_micro_batch`, with :attr:`vision_filler` appended to a group that lacks
        one of the filler's kinds of media (images, videos); the filler's tokens count as
        padding and its meta says ``filler``."""
        filler = self.vision_filler
        if filler is None or not needs_filler(group, filler):
            return self.make_micro_batch(group)
        mb = self.make_micro_batch([*group, filler])
        mb.num_samples -= 1
        mb.num_images -= filler.num_images
        mb.num_tokens -= filler.length
        mb.num_padding += filler.length
        mb.meta[-1] = {"filler": True}
        return mb

    def make_micro_batch(self, features: Sequence[SampleFeatures]) -> MicroBatch:
        """Lay out one micro-batch's tensors."""
        raise NotImplementedError

    def to_device(
        self, micro_batch: MicroBatch, device: torch.device
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        """Return ``(model_inputs, loss_inputs)`` on ``device``."""
        import torch

        moved: dict[int, torch.Tensor] = {}

        def move(value: Any) -> Any:
            # A tensor given twice (cu_seq_lens_q/k) stays one tensor on the device.
            if isinstance(value, torch.Tensor):
                if id(value) not in moved:
                    moved[id(value)] = value.to(device, non_blocking=True)
                return moved[id(value)]
            return value

        return (
            {k: move(v) for k, v in micro_batch.model_inputs.items()},
            {k: move(v) for k, v in micro_batch.loss_inputs.items()},
        )
