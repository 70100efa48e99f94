"""Encoder outputs split per image (or video), for code that moves or regroups them:
encoder parallelism (the plugin) and :meth:`HFModelAdapter.inject_vision_outputs
<hyper_core.adapters.hf.HFModelAdapter.inject_vision_outputs>`.

:meth:`~hyper_core.adapters.base.VisionEncoderAdapter.call_vision_encoder` returns a dataclass
(``transformers`` ``ModelOutput``) whose per-image results are sequences of one tensor per
image (``pooler_output``; Qwen3-VL's ``deepstack_features`` is a list of such sequences).
:class:`FlatOutputs` packs each image's tensors into rows ``(tokens_i, F)``, takes any run of
the images, and rebuilds the same structure for any images. Fields that are not per-image
(``last_hidden_state``, concatenated over patches) are not carried: the language model reads
only per-image fields.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

import torch


@dataclasses.dataclass
class _Leaf:
    index: int


@dataclasses.dataclass
class _Seq:
    kind: type
    children: list[Any]


_DROP = None


class FlatOutputs:
    """An encoder output split into per-image rows, and rebuilt for other images.

    Built from this rank's own encoder output (every rank computes at least one image, real or
    dummy, so every rank knows the structure, the trailing shapes and the dtypes).
    """

    def __init__(self, outputs: Any, num_images: int) -> None:
        if not dataclasses.is_dataclass(outputs):
            raise TypeError(
                "call_vision_encoder must return a dataclass (a transformers ModelOutput), got "
                f"{type(outputs).__name__}"
            )
        self.cls = type(outputs)
        values = {f.name: getattr(outputs, f.name) for f in dataclasses.fields(outputs)}
        ref_name = "pooler_output" if "pooler_output" in values else None
        if ref_name is None or not _per_image(values[ref_name], num_images, None):
            raise TypeError(
                "call_vision_encoder's output must hold its per-image features as "
                "`pooler_output`, a sequence of one tensor per image"
            )
        self.rows = [int(t.shape[0]) for t in values[ref_name]]
        self.leaves: list[Sequence[torch.Tensor]] = []
        self.spec = {name: self._walk(v, num_images) for name, v in values.items()}
        first = [leaf[0] for leaf in self.leaves]
        self.trailing = [tuple(t.shape[1:]) for t in first]
        self.dtypes = [t.dtype for t in first]
        self.widths = [math.prod(s) for s in self.trailing]
        self.pack_dtype = self.dtypes[0]
        for leaf, trailing, dtype in zip(self.leaves, self.trailing, self.dtypes, strict=True):
            for t in leaf:
                if tuple(t.shape[1:]) != trailing or t.dtype != dtype:
                    raise TypeError("per-image encoder outputs differ in trailing shape or dtype")

    def _walk(self, value: Any, n: int) -> Any:
        if _per_image(value, n, self.rows):
            self.leaves.append(value)
            return _Leaf(len(self.leaves) - 1)
        if isinstance(value, (list, tuple)) and value:
            mark = len(self.leaves)
            children = [self._walk(v, n) for v in value]
            if all(c is not _DROP for c in children):
                return _Seq(type(value), children)
            del self.leaves[mark:]  # a mixed sequence is not carried at all
        return _DROP

    @property
    def width(self) -> int:
        """Columns of a packed row."""
        return sum(self.widths)

    def pack(self) -> torch.Tensor:
        """All images' tensors as ``(Σ tokens_i, width)`` rows, image after image."""
        blocks = [
            torch.cat(
                [leaf[i].reshape(rows, -1).to(self.pack_dtype) for leaf in self.leaves], dim=1
            )
            for i, rows in enumerate(self.rows)
        ]
        return torch.cat(blocks, dim=0)

    def unpack(self, block: torch.Tensor) -> list[torch.Tensor]:
        """One image's tensors (one per leaf) from its ``(tokens, width)`` rows."""
        out, pos = [], 0
        rows = block.shape[0]
        for width, trailing, dtype in zip(self.widths, self.trailing, self.dtypes, strict=True):
            out.append(block[:, pos : pos + width].reshape(rows, *trailing).to(dtype))
            pos += width
        return out

    def rebuild(self, images: Sequence[Sequence[torch.Tensor]]) -> Any:
        """An output of the same type for ``images`` (each a list of its leaf tensors)."""

        def build(spec: Any) -> Any:
            if isinstance(spec, _Leaf):
                return tuple(img[spec.index] for img in images)
            if isinstance(spec, _Seq):
                return spec.kind(build(c) for c in spec.children)
            return None

        return self.cls(**{name: build(spec) for name, spec in self.spec.items()})

    def take(self, start: int, stop: int) -> Any:
        """An output of the same type holding images ``start:stop`` only."""
        return self.rebuild([[leaf[i] for leaf in self.leaves] for i in range(start, stop)])


def _per_image(value: Any, n: int, rows: Sequence[int] | None) -> bool:
    """A sequence of ``n`` tensors (with ``rows[i]`` rows each, when given)."""
    if not isinstance(value, (list, tuple)) or len(value) != n or n == 0:
        return False
    for i, t in enumerate(value):
        if not isinstance(t, torch.Tensor) or t.dim() < 1:
            return False
        if rows is not None and t.shape[0] != rows[i]:
            return False
    return True
