"""Counting bytes from the tensors themselves: parameters, gradients, optimizer state, buffers.

Every figure is the local storage of this rank: a DTensor (FSDP2 shard) counts its
``to_local()`` part. Each category is broken down by dtype and by module group (the adapter's
``freeze_groups`` paths: ``vision``, ``projector``, ``language``; anything else is ``other``).
Shared tensors (tied embeddings) are counted once, in the group of their first name.
"""

from __future__ import annotations

import os
import resource
import sys
from collections.abc import Iterable, Mapping
from typing import Any

import torch

CATEGORIES: tuple[str, ...] = ("params", "grads", "optimizer", "buffers")
OTHER = "other"


def local_tensor(t: torch.Tensor) -> torch.Tensor:
    """The rank-local part of ``t`` (``to_local()`` for a DTensor)."""
    to_local = getattr(t, "to_local", None)
    return to_local() if callable(to_local) else t


def _packed(t: torch.Tensor) -> bool:
    """A tensor subclass that holds its values in inner tensors (torchao's NF4 weight)."""
    return (
        type(t) is not torch.Tensor
        and type(t) is not torch.nn.Parameter
        and hasattr(t, "__tensor_flatten__")
    )


def tensor_bytes(t: torch.Tensor) -> int:
    """Bytes of ``t``'s storage: a packed subclass's inner tensors (4-bit codes, scales)."""
    if _packed(t):
        names, _ = t.__tensor_flatten__()
        return sum(tensor_bytes(getattr(t, n)) for n in names)
    return t.numel() * t.element_size()


def dtype_name(t: torch.Tensor) -> str:
    """``torch.float32`` -> ``float32``; a packed subclass's lower-cased class name less
    ``Tensor`` (``NF4Tensor`` -> ``nf4``)."""
    local = local_tensor(t)
    if _packed(local):
        return type(local).__name__.removesuffix("Tensor").lower()
    return str(local.dtype).removeprefix("torch.")


class GroupMap:
    """Maps a parameter/buffer name to its module group by the longest matching path."""

    def __init__(self, groups: Mapping[str, Iterable[str]]) -> None:
        self._order = list(groups)
        self._paths = sorted(
            ((path, group) for group, paths in groups.items() for path in paths),
            key=lambda item: -len(item[0]),
        )

    def group_of(self, name: str) -> str:
        """The group of the dotted tensor ``name``; ``other`` when no path contains it."""
        for path, group in self._paths:
            if path == "" or name == path or name.startswith(path + "."):
                return group
        return OTHER

    @property
    def groups(self) -> list[str]:
        """The group names, in declaration order, then ``other``."""
        return self._order if OTHER in self._order else [*self._order, OTHER]


def _new_category() -> dict[str, Any]:
    return {"total": 0, "by_dtype": {}, "by_group": {}, "count": 0, "meta": 0}


def _add(cat: dict[str, Any], t: torch.Tensor, group: str) -> None:
    local = local_tensor(t)
    n = tensor_bytes(local)
    if local.is_meta:  # no storage: a rank that waits for its weights (meta init)
        cat["meta"] += n
        return
    cat["total"] += n
    cat["count"] += 1
    dt = dtype_name(t)
    cat["by_dtype"][dt] = cat["by_dtype"].get(dt, 0) + n
    cat["by_group"][group] = cat["by_group"].get(group, 0) + n


def account(
    model: torch.nn.Module | None, optimizer: Any, groups: GroupMap
) -> dict[str, dict[str, Any]]:
    """Bytes of ``model``'s parameters, gradients and buffers and ``optimizer``'s state.

    Returns ``{category: {"total", "by_dtype", "by_group", "count", "meta"}}`` for
    :data:`CATEGORIES`. Optimizer state is grouped by the parameter it belongs to; state of a
    parameter the model doesn't own is ``other``. Meta-device tensors hold no memory: their
    would-be bytes go to ``meta``, not to the totals.
    """
    out = {c: _new_category() for c in CATEGORIES}
    name_of: dict[int, str] = {}
    if model is not None:
        for name, p in model.named_parameters():
            name_of[id(p)] = name
            group = groups.group_of(name)
            _add(out["params"], p, group)
            if p.grad is not None:
                _add(out["grads"], p.grad, group)
        for name, b in model.named_buffers():
            _add(out["buffers"], b, groups.group_of(name))
    if optimizer is not None:
        for p, state in getattr(optimizer, "state", {}).items():
            name = name_of.get(id(p))
            group = groups.group_of(name) if name is not None else OTHER
            for value in state.values() if isinstance(state, Mapping) else ():
                if isinstance(value, torch.Tensor):
                    _add(out["optimizer"], value, group)
    return out


# -- process memory -----------------------------------------------------------------------------


_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def current_rss() -> int | None:
    """This process's resident set size in bytes (Linux ``/proc/self/statm``), else None."""
    try:
        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[1]) * _PAGE
    except (OSError, ValueError, IndexError):
        return None


def max_rss() -> int:
    """The process's lifetime peak RSS in bytes (``getrusage``)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak if sys.platform == "darwin" else peak * 1024)


def device_memory(device: Any) -> dict[str, int]:
    """CUDA ``allocated``/``reserved``/``peak_allocated``; on CPU ``rss`` and ``peak_rss``."""
    if device is not None and getattr(device, "type", "cpu") == "cuda":
        return {
            "allocated": int(torch.cuda.memory_allocated(device)),
            "reserved": int(torch.cuda.memory_reserved(device)),
            "peak_allocated": int(torch.cuda.max_memory_allocated(device)),
        }
    rss = current_rss()
    out = {"peak_rss": max_rss()}
    if rss is not None:
        out["rss"] = rss
    return out
