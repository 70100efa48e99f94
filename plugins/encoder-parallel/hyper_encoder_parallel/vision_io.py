"""Moving vision inputs and encoder outputs between ranks as plain tensors.

Inputs: the adapter's :meth:`~hyper_core.adapters.ModelAdapter.split_vision_inputs` gives one
dict per image keyed by :attr:`~hyper_core.adapters.VisionEncoderSpec.input_keys`: the patch
tensor first (``(patches_i, ...)``), then small per-image metadata (``image_grid_thw``
``(1, 3)``), then the image's rows of the micro-batch's ``image_meta`` under
:attr:`~hyper_core.adapters.VisionEncoderSpec.meta_keys` (a tile count). A :class:`Schema`
(dtypes and trailing shapes) and one int64 record per image (patch rows, metadata values)
describe them to every rank.

Outputs travel as the rows of the core's
:class:`~hyper_core.adapters.vision_outputs.FlatOutputs`.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence

import torch

#: dtype <-> the int code sent in headers.
DTYPES: tuple[torch.dtype, ...] = (
    torch.float32,
    torch.bfloat16,
    torch.float16,
    torch.float64,
    torch.int64,
    torch.int32,
    torch.int16,
    torch.int8,
    torch.uint8,
    torch.bool,
)
MAX_TRAILING = 4  # trailing dims of the patch tensor: (patches, D) or (patches, C, P, P)
MAX_META_DIMS = 3  # dims of one image's metadata tensor: (1, 3)


def dtype_code(dtype: torch.dtype) -> int:
    """The header code of ``dtype``."""
    try:
        return DTYPES.index(dtype)
    except ValueError:
        raise TypeError(f"encoder_parallel cannot send tensors of dtype {dtype}") from None


@dataclasses.dataclass(frozen=True)
class Schema:
    """The layout of one image's vision inputs (the same on every rank)."""

    keys: tuple[str, ...]
    patch_dtype: torch.dtype
    patch_trailing: tuple[int, ...]
    meta_dtypes: tuple[torch.dtype, ...]
    meta_shapes: tuple[tuple[int, ...], ...]

    @staticmethod
    def header_len(keys: Sequence[str]) -> int:
        """Ints in a rank's header: count, patch dtype/ndim/dims, per key dtype/ndim/dims."""
        return 3 + MAX_TRAILING + (len(keys) - 1) * (2 + MAX_META_DIMS)

    @property
    def meta_numels(self) -> list[int]:
        """Values per image of each metadata key."""
        return [math.prod(shape) for shape in self.meta_shapes]

    @property
    def record_len(self) -> int:
        """Ints per image record: patch rows, then every metadata value."""
        return 1 + sum(self.meta_numels)

    @classmethod
    def of(cls, keys: Sequence[str], image: Mapping[str, torch.Tensor]) -> Schema:
        """The schema of one image's inputs."""
        missing = [k for k in keys if k not in image]
        if missing or len(image) != len(keys):
            raise ValueError(
                f"split_vision_inputs gave keys {sorted(image)}, the vision encoder spec "
                f"declares {list(keys)}"
            )
        patches = image[keys[0]]
        if patches.dim() - 1 > MAX_TRAILING:
            raise ValueError(f"patch tensor {tuple(patches.shape)} has too many dims")
        metas = [image[k] for k in keys[1:]]
        for k, t in zip(keys[1:], metas, strict=True):
            if t.dim() > MAX_META_DIMS:
                raise ValueError(f"per-image {k!r} {tuple(t.shape)} has too many dims")
        return cls(
            keys=tuple(keys),
            patch_dtype=patches.dtype,
            patch_trailing=tuple(patches.shape[1:]),
            meta_dtypes=tuple(t.dtype for t in metas),
            meta_shapes=tuple(tuple(t.shape) for t in metas),
        )

    def header(self, count: int) -> list[int]:
        """This rank's header for ``count`` images."""
        trailing = list(self.patch_trailing) + [0] * (MAX_TRAILING - len(self.patch_trailing))
        out = [count, dtype_code(self.patch_dtype), len(self.patch_trailing), *trailing]
        for dtype, shape in zip(self.meta_dtypes, self.meta_shapes, strict=True):
            dims = list(shape) + [0] * (MAX_META_DIMS - len(shape))
            out += [dtype_code(dtype), len(shape), *dims]
        return out

    @classmethod
    def from_header(cls, keys: Sequence[str], header: Sequence[int]) -> Schema:
        """The schema a (non-empty) rank's header describes."""
        ndim = header[2]
        trailing = tuple(header[3 : 3 + ndim])
        pos = 3 + MAX_TRAILING
        dtypes, shapes = [], []
        for _ in keys[1:]:
            dtypes.append(DTYPES[header[pos]])
            n = header[pos + 1]
            shapes.append(tuple(header[pos + 2 : pos + 2 + n]))
            pos += 2 + MAX_META_DIMS
        return cls(
            keys=tuple(keys),
            patch_dtype=DTYPES[header[1]],
            patch_trailing=trailing,
            meta_dtypes=tuple(dtypes),
            meta_shapes=tuple(shapes),
        )

    def record(self, image: Mapping[str, torch.Tensor]) -> list[int]:
        """One image's record: patch rows, then its metadata values as int64."""
        return self.records([image])[0]

    def records(self, images: Sequence[Mapping[str, torch.Tensor]]) -> list[list[int]]:
        """Every image's record, with one device-to-host copy for all of them (not one per
        image: each would wait for the device)."""
        if not images:
            return []
        rows = [[int(img[self.keys[0]].shape[0])] for img in images]
        if len(self.keys) == 1:
            return rows
        per_image = torch.stack(
            [torch.cat([_to_int64(img[k]).reshape(-1) for k in self.keys[1:]]) for img in images]
        ).tolist()
        return [r + v for r, v in zip(rows, per_image, strict=True)]

    def metadata(self, record: Sequence[int], device: torch.device) -> dict[str, torch.Tensor]:
        """The metadata tensors of an image from its record."""
        return self.metadata_of([record], device)[0]

    def metadata_of(
        self,
        records: Sequence[Sequence[int]],
        device: torch.device,
        keys: Sequence[str] | None = None,
    ) -> list[dict[str, torch.Tensor]]:
        """The metadata tensors (of ``keys``, default all) of several images, with one
        host-to-device copy for all of them (from page-locked memory on CUDA, so the host
        does not wait)."""
        host = torch.tensor([list(r[1:]) for r in records], dtype=torch.int64)
        if device.type == "cuda":
            host = host.pin_memory()
        values = host.to(device, non_blocking=True)
        return [self._unpack(row, keys) for row in values]

    def host_metadata_of(
        self, records: Sequence[Sequence[int]], keys: Sequence[str]
    ) -> dict[str, torch.Tensor]:
        """The metadata of ``keys`` of several images as host tensors, each key's rows
        concatenated in order (what a :class:`~hyper_core.adapters.VisionContext` holds)."""
        host = torch.tensor([list(r[1:]) for r in records], dtype=torch.int64)
        rows = [self._unpack(row, keys) for row in host]
        return {k: torch.cat([r[k] for r in rows], dim=0) for k in keys}

    def _unpack(self, row: torch.Tensor, keys: Sequence[str] | None) -> dict[str, torch.Tensor]:
        meta, pos = {}, 0
        for key, dtype, shape, n in zip(
            self.keys[1:], self.meta_dtypes, self.meta_shapes, self.meta_numels, strict=True
        ):
            if keys is None or key in keys:
                meta[key] = _from_int64(row[pos : pos + n], dtype).reshape(shape)
            pos += n
        return meta

    def empty_patches(self, rows: int, device: torch.device) -> torch.Tensor:
        """A ``(rows, *trailing)`` patch buffer."""
        return torch.empty((rows, *self.patch_trailing), dtype=self.patch_dtype, device=device)


def _to_int64(t: torch.Tensor) -> torch.Tensor:
    if t.is_floating_point():
        return t.detach().to(torch.float64).view(torch.int64)
    return t.detach().to(torch.int64)


def _from_int64(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    if dtype.is_floating_point:
        return t.view(torch.float64).to(dtype)
    return t.to(dtype)


def merge_inputs(images: Sequence[Mapping[str, torch.Tensor]], keys: Sequence[str]) -> dict:
    """Several images' inputs as one encoder input (each key concatenated along dim 0)."""
    return {k: torch.cat([img[k] for img in images], dim=0) for k in keys}
