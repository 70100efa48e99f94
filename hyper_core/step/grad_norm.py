"""The global gradient norm and clipping, over gradients that may live on several meshes.

FSDP2 gradients are DTensors whose per-rank norm is partial: ``full_tensor`` reduces it over
their mesh. With expert parallelism the expert weights sit on another mesh than the rest
(``(efsdp, ep)`` against ``dp_shard``), and one DTensor op cannot mix meshes, so the norm is
taken per mesh and the partial norms are combined (``sqrt(Σ nᵢ²)``).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch


def by_mesh(tensors: Iterable[torch.Tensor]) -> list[list[torch.Tensor]]:
    """``tensors`` grouped by DTensor device mesh (plain tensors form one group), in the
    order each group first appears."""
    groups: dict[object, list[torch.Tensor]] = {}
    for t in tensors:
        groups.setdefault(getattr(t, "device_mesh", None), []).append(t)
    return list(groups.values())


def total_grad_norm(params: Iterable[torch.nn.Parameter]) -> torch.Tensor | None:
    """The L2 norm of all gradients of ``params`` (a 0-d tensor, the same on every rank);
    None when no parameter has a gradient."""
    import torch

    groups = by_mesh(p.grad for p in params if p.grad is not None)
    norms = []
    for grads in groups:
        norm = torch.nn.utils.get_total_norm(grads, 2.0, foreach=True)
        norms.append(norm.full_tensor() if hasattr(norm, "full_tensor") else norm)
    if len(norms) <= 1:
        return norms[0] if norms else None
    return torch.stack(norms).norm(2.0)


def clip_grads(params: Iterable[torch.nn.Parameter], max_norm: float, norm: torch.Tensor) -> None:
    """Scale the gradients of ``params`` so that their global norm ``norm`` is at most
    ``max_norm``."""
    import torch

    groups: dict[object, list[torch.nn.Parameter]] = {}
    for p in params:
        if p.grad is not None:
            groups.setdefault(getattr(p.grad, "device_mesh", None), []).append(p)
    for group in groups.values():
        torch.nn.utils.clip_grads_with_norm_(group, max_norm, norm, foreach=True)
