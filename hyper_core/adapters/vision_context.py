"""What an adapter's vision-encoder methods know beyond the model inputs: the resolved config
and the per-image metadata of the images at hand.

:class:`VisionContext` is the last argument of
:meth:`~hyper_core.adapters.base.VisionEncoderAdapter.split_vision_inputs`,
:meth:`~hyper_core.adapters.base.VisionEncoderAdapter.call_vision_encoder` and
:meth:`~hyper_core.adapters.base.VisionEncoderAdapter.inject_vision_outputs`. Its metadata
is the micro-batch's :attr:`~hyper_core.batching.types.MicroBatch.image_meta` (a processor's
``metadata_keys``, e.g. each image's tile count): host tensors with one row per image, never
given to the model, so reading a count waits for no device.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import attrs

if TYPE_CHECKING:
    import torch

    from ..batching.types import MicroBatch


@attrs.frozen(kw_only=True)
class VisionContext:
    """The model's resolved config and the per-image metadata of some images."""

    #: The resolved ``transformers`` config of the model (``model.config``, what the
    #: adapter's ``hf_config`` gave): token ids, feature-layer settings...
    config: Any
    #: Per-image metadata: key -> host tensor whose row ``i`` belongs to image ``i`` (images
    #: in :meth:`~hyper_core.adapters.base.VisionEncoderAdapter.split_vision_inputs` order).
    #: Empty when the processor declares no ``metadata_keys``.
    image_meta: Mapping[str, torch.Tensor] = attrs.field(factory=dict)

    @classmethod
    def of(cls, micro_batch: MicroBatch, config: Any) -> VisionContext:
        """The context of a micro-batch's images (its :attr:`MicroBatch.image_meta`)."""
        return cls(config=config, image_meta=dict(micro_batch.image_meta))

    def counts(self, key: str) -> list[int]:
        """The per-image integers under ``key`` (e.g. tile counts), read on the host.

        Raises ``KeyError`` naming the key when the micro-batch does not carry it.
        """
        value = self.image_meta.get(key)
        if value is None:
            have = ", ".join(sorted(self.image_meta)) or "none"
            raise KeyError(
                f"per-image metadata {key!r} is missing (the micro-batch carries: {have}); the "
                "processor must list it in metadata_keys and return one entry per image"
            )
        rows = value if value.dim() == 1 else value.flatten(1)[:, 0]
        return [int(v) for v in rows.tolist()]

    def take(self, indices: Sequence[int]) -> VisionContext:
        """The context of images ``indices`` (in that order) only."""
        import torch

        index = torch.as_tensor(list(indices), dtype=torch.long)
        meta = {k: v.index_select(0, index) for k, v in self.image_meta.items()}
        return attrs.evolve(self, image_meta=meta)


__all__ = ["VisionContext"]
