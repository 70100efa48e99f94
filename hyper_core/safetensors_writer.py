"""Streaming safetensors shards in the layout ``save_pretrained`` writes.

Tensors arrive a group at a time; the writer buffers at most one shard and writes it as soon as
the next tensor would not fit. Shards are split by ``huggingface_hub``'s rule (a tensor larger
than the maximum gets a shard of its own, written at once; otherwise a new shard starts when the
next tensor would overflow the current one) and named ``model-0000i-of-0000n.safetensors`` with
``model.safetensors.index.json`` at :meth:`ShardedSafetensorsWriter.close`, or
``model.safetensors`` when everything fits one shard.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

#: ``save_pretrained``'s default.
MAX_SHARD_SIZE = "5GB"
SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
_PART = "model-{:05d}.safetensors.part"
_SHARD = "model-{:05d}-of-{:05d}.safetensors"


def parse_shard_size(size: str | int) -> int:
    """``"5GB"``, ``"500MB"``, ``"10KB"`` or a number of bytes → bytes (``ValueError`` if not)."""
    if isinstance(size, int):
        value = size
    else:
        from huggingface_hub.serialization._base import parse_size_to_int

        text = size.strip()
        value = int(text) if text.isdigit() else parse_size_to_int(text)
    if value <= 0:
        raise ValueError(f"a shard size must be positive, not {size!r}")
    return value


def tensor_bytes(tensor: torch.Tensor) -> int:
    """The bytes ``tensor`` takes in a safetensors file."""
    return tensor.numel() * tensor.element_size()


def _own_storage(tensor: torch.Tensor) -> torch.Tensor:
    """``tensor`` with a storage of exactly its own bytes (views of a bigger tensor, e.g. one
    expert of a fused weight, would otherwise keep the whole of it alive and in the file)."""
    tensor = tensor.detach()
    if not tensor.is_contiguous() or tensor.untyped_storage().nbytes() != tensor_bytes(tensor):
        return tensor.contiguous().clone()
    return tensor


def format_bytes(n: int) -> str:
    """Bytes for a log line, in decimal units as the shard sizes are given."""
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} B"


class ShardedSafetensorsWriter:
    """Writes named tensors into HF-named safetensors shards, one shard in memory at a time.

    :attr:`peak_bytes` is the most tensor bytes it ever buffered (at most ``max_shard_size``;
    a tensor over the maximum is written straight through to a shard of its own).
    """

    def __init__(
        self,
        out_dir: str | Path,
        *,
        max_shard_size: str | int = MAX_SHARD_SIZE,
        logger: logging.Logger | None = None,
    ) -> None:
        self.out_dir = Path(out_dir)
        self.out_dir.mkdir(parents=True, exist_ok=True)
        self.max_shard_size = parse_shard_size(max_shard_size)
        self.peak_bytes = 0
        self.total_size = 0
        self.total_parameters = 0
        self._logger = logger
        self._buffer: dict[str, torch.Tensor] = {}
        self._buffered = 0
        self._parts: list[list[str]] = []
        self._seen: set[str] = set()
        self.progress = ""

    def add(self, tensors: Mapping[str, torch.Tensor]) -> None:
        """Queue ``tensors`` (written once their shard is full or at :meth:`close`)."""
        for name, tensor in tensors.items():
            if name in self._seen:
                raise ValueError(f"tensor {name!r} written twice")
            self._seen.add(name)
            size = tensor_bytes(tensor)
            self.total_size += size
            self.total_parameters += tensor.numel()
            if size > self.max_shard_size:
                self._write({name: _own_storage(tensor)}, size)
                continue
            if self._buffer and self._buffered + size > self.max_shard_size:
                self._flush()
            self._buffer[name] = _own_storage(tensor)
            self._buffered += size
            self.peak_bytes = max(self.peak_bytes, self._buffered)

    def close(self) -> list[Path]:
        """Write the last shard, give the shards their final names, write the index."""
        if self._buffer:
            self._flush()
        if not self._parts:
            raise ValueError("nothing to export: no tensors were written")
        n = len(self._parts)
        names = [SINGLE_FILE] if n == 1 else [_SHARD.format(i + 1, n) for i in range(n)]
        for i, name in enumerate(names):
            (self.out_dir / _PART.format(i + 1)).replace(self.out_dir / name)
        self._remove_stale(set(names))
        if n > 1:
            weight_map = {k: name for name, keys in zip(names, self._parts) for k in keys}
            index = {
                "metadata": {
                    "total_parameters": self.total_parameters,
                    "total_size": self.total_size,
                },
                "weight_map": dict(sorted(weight_map.items())),
            }
            (self.out_dir / INDEX_FILE).write_text(json.dumps(index, indent=2) + "\n")
        return [self.out_dir / name for name in names]

    def _flush(self) -> None:
        self._write(self._buffer, self._buffered)
        self._buffer = {}
        self._buffered = 0

    def _write(self, shard: dict[str, torch.Tensor], size: int) -> None:
        from safetensors.torch import save_file

        self._parts.append(list(shard))
        name = _PART.format(len(self._parts))
        save_file(shard, str(self.out_dir / name), metadata={"format": "pt"})
        if self._logger is not None:
            tail = f", {self.progress}" if self.progress else ""
            self._logger.info(
                "export: wrote shard %d (%s)%s", len(self._parts), format_bytes(size), tail
            )

    def _remove_stale(self, keep: set[str]) -> None:
        """Weights of an earlier export into the same directory that this one did not replace
        (and parts an interrupted one left)."""
        import re

        stale = re.compile(
            r"model-\d{5}-of-\d{5}\.safetensors|model-\d{5}\.safetensors\.part"
            r"|model\.safetensors(\.index\.json)?"
        )
        for path in self.out_dir.iterdir():
            if path.name not in keep and stale.fullmatch(path.name) and path.is_file():
                if path.name == INDEX_FILE and len(keep) > 1:
                    continue
                path.unlink()
