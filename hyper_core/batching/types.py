"""What a sample looks like after the adapter's transform, and what a micro-batch is."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import attrs

if TYPE_CHECKING:
    import torch

IGNORE_INDEX = -100


@attrs.define(kw_only=True)
class SampleFeatures:
    """One tokenised sample, ready for a batching runtime.

    ``labels`` are already shifted: ``labels[i]`` is the token predicted at position ``i``
    (``IGNORE_INDEX`` where no loss is taken), so that packing never predicts across samples.
    """

    input_ids: torch.Tensor  # (L,) int64
    labels: torch.Tensor  # (L,) int64, shifted
    #: (L,) or (C, L), e.g. C=3/4 for mRoPE; None means 0..L-1.
    position_ids: torch.Tensor | None = None
    #: Per-token fields of shape (L,), concatenated/padded like input_ids (mm_token_type_ids).
    token_fields: dict[str, torch.Tensor] = attrs.field(factory=dict)
    #: Fields concatenated along dim 0 across samples in order (pixel_values, image_grid_thw).
    media: dict[str, torch.Tensor] = attrs.field(factory=dict)
    num_images: int = 0
    #: Per-image metadata that is no model input (the processor's ``metadata_keys``, e.g. a
    #: tile count): key -> tensor with one row per image, concatenated across samples like
    #: :attr:`media` into :attr:`MicroBatch.image_meta`.
    image_meta: dict[str, torch.Tensor] = attrs.field(factory=dict)
    #: Videos in the sample (with images, what decides where the vision filler goes).
    num_videos: int = 0
    #: Free-form information for evaluation and metrics (never given to the model).
    meta: dict[str, Any] = attrs.field(factory=dict)
    #: ``[start, end)`` token ranges whose tokens attend to each other both ways inside the
    #: causal decoder (Gemma 3's image tokens, a prefix): the packed runtime gives them to
    #: ``varlen`` attention (:data:`hyper_core.attention.BIDIRECTIONAL_SPANS`). The model's own
    #: mask (under ``sdpa``/``eager``, or padded) must come from its inputs (``token_type_ids``).
    bidirectional_spans: tuple[tuple[int, int], ...] = ()

    def parts(self) -> dict[str, SampleFeatures]:
        """The sequences this sample holds, by name, for display (``data show``): itself,
        unnamed. A sample of several sequences (a preference pair) names each."""
        return {"": self}

    @property
    def length(self) -> int:
        """Number of tokens."""
        return int(self.input_ids.shape[0])

    @property
    def num_loss_tokens(self) -> int:
        """Number of positions that carry a loss."""
        return int((self.labels != IGNORE_INDEX).sum())


@attrs.define(kw_only=True)
class MicroBatch:
    """One forward/backward worth of samples, on the host until ``get_batch`` moves it."""

    model_inputs: dict[str, Any]
    loss_inputs: dict[str, Any]
    num_samples: int
    num_tokens: int  # real (non-padding) tokens
    num_padding: int  # padding tokens in the tensors given to the model
    num_loss_tokens: int
    num_images: int = 0
    #: The samples' :attr:`SampleFeatures.image_meta`, each key's rows concatenated in sample
    #: order: host tensors, never moved to the device nor given to the model (the vision
    #: methods read them through :class:`~hyper_core.adapters.vision_context.VisionContext`).
    image_meta: dict[str, torch.Tensor] = attrs.field(factory=dict)
    #: Token count of each sample, in order (attention FLOPs, packing statistics).
    sample_lengths: list[int] = attrs.field(factory=list)
    meta: list[dict[str, Any]] = attrs.field(factory=list)

    def pin_memory(self) -> MicroBatch:
        """This micro-batch with its tensors in page-locked memory (called by the
        DataLoader's pinning thread for a CUDA run without workers)."""
        import torch

        def pinned(values: dict[str, Any]) -> dict[str, Any]:
            return {
                k: v.pin_memory() if isinstance(v, torch.Tensor) else v for k, v in values.items()
            }

        return attrs.evolve(
            self, model_inputs=pinned(self.model_inputs), loss_inputs=pinned(self.loss_inputs)
        )

    @property
    def padding_ratio(self) -> float:
        """Fraction of the model's input positions that are padding."""
        total = self.num_tokens + self.num_padding
        return self.num_padding / total if total else 0.0
