"""The vision tower under context parallelism: each rank of a cp group encodes a share of the
micro-batch's images and videos, and every rank gets every output.

A cp group's ranks read the same rows, so without this every one of them would run the tower
on all of the rows' images (replicated work and activations). The tower's forward is wrapped
(training forwards only; evaluation stays whole):

1. the images (videos: one entry per video) are cut into ``cp`` contiguous shares of about
   equal patches, the same on every rank (from the call's grid of patches, one small host
   read);
2. each rank runs the tower on its share, or on a zero-pixel copy of the smallest image when
   its share is empty, so FSDP2's per-block all-gathers and reduce-scatters stay matched;
3. each row-wise output (``pooler_output``, ``last_hidden_state``, a tuple of per-layer
   features) is all-gathered in image order through
   :func:`~hyper_core.parallel.all_to_all.all_to_all`, whose backward returns to each rank
   the gradients of its rows from every rank, so the tower's weights get the sum of every
   rank's partial loss, as when each rank encoded everything. A dummy's output is added
   times 0, so its backward still runs.

The merge into ``inputs_embeds`` and the split of the decoder's tokens then proceed as
before (:mod:`~hyper_core.parallel.context_parallel`). It applies to towers called as
``tower(patches, KEY=(n, 3))``, ``KEY`` the adapter's
:meth:`~hyper_core.adapters.ContextParallelAdapter.vision_grid_keyword`, with the patches of
image ``i`` the ``t·h·w`` rows after image ``i-1``'s; a tower called otherwise runs whole on
every rank.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from itertools import pairwise
from typing import TYPE_CHECKING, Any

import attrs
import torch

from .all_to_all import all_to_all

if TYPE_CHECKING:
    from torch.distributed import ProcessGroup

    from .env import DistEnv


def image_shares(patches: Sequence[int], cp: int) -> list[tuple[int, int]]:
    """``cp`` contiguous ``[start, stop)`` ranges of the images, each about ``1/cp`` of the
    patches (a share may be empty when there are fewer images than ranks)."""
    total = sum(patches)
    bounds, seen, image = [0], 0, 0
    for rank in range(1, cp):
        target = total * rank / cp
        while image < len(patches) and seen + patches[image] / 2 <= target:
            seen += patches[image]
            image += 1
        bounds.append(image)
    bounds.append(len(patches))
    return list(pairwise(bounds))


@attrs.define
class SplitTower:
    """The wrapped ``forward`` of a vision tower (see the module doc)."""

    tower: torch.nn.Module
    original: Callable[..., Any]
    cp: int
    rank: int
    group: ProcessGroup
    #: The keyword of the call's ``(n, 3)`` grid of patches per image or video.
    grid_keyword: str
    #: Patches this rank encoded, over training forwards (dummies excluded): for tests and logs.
    patches_encoded: int = 0

    def __call__(self, hidden_states: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        grid = kwargs.get(self.grid_keyword)
        if args or grid is None or not self.tower.training or not torch.is_grad_enabled():
            return self.original(hidden_states, *args, **kwargs)
        patches = [int(n) for n in grid.prod(-1).tolist()]
        if not patches:
            return self.original(hidden_states, *args, **kwargs)
        offsets = [0]
        for n in patches:
            offsets.append(offsets[-1] + n)
        shares = image_shares(patches, self.cp)
        start, stop = shares[self.rank]
        dummy = start == stop
        if dummy:  # the smallest image, zero pixels: keeps FSDP2's collectives matched
            start = min(range(len(patches)), key=patches.__getitem__)
            stop = start + 1
            mine = torch.zeros_like(hidden_states[offsets[start] : offsets[stop]])
        else:
            mine = hidden_states[offsets[start] : offsets[stop]]
            self.patches_encoded += offsets[stop] - offsets[start]
        out = self.original(mine, **{**kwargs, self.grid_keyword: grid[start:stop]})
        encoded = offsets[stop] - offsets[start]
        share_patches = [offsets[b] - offsets[a] for a, b in shares]
        for key, value in list(out.items()):
            if isinstance(value, torch.Tensor):
                setattr(out, key, self._gather(value, encoded, share_patches, dummy))
            elif isinstance(value, (list, tuple)) and all(
                isinstance(v, torch.Tensor) for v in value
            ):
                gathered = [self._gather(v, encoded, share_patches, dummy) for v in value]
                setattr(out, key, type(value)(gathered))
        return out

    def _gather(
        self, rows: torch.Tensor, encoded: int, share_patches: list[int], dummy: bool
    ) -> torch.Tensor:
        """Every rank's ``rows`` in rank (= image) order; ``rows`` has ``encoded`` patches'
        worth (a fixed number of rows per patch, e.g. 1/4 after a 2×2 merge)."""
        recv = [n * rows.shape[0] // encoded for n in share_patches]
        sent = 0 if dummy else rows.shape[0]
        send = rows[:sent].repeat(self.cp, *([1] * (rows.dim() - 1)))
        gathered = all_to_all(send, [sent] * self.cp, recv, self.group)
        if dummy:
            gathered = gathered + rows.sum() * 0
        return gathered


def split_vision_tower(
    model: torch.nn.Module, module: str, dist: DistEnv, grid_keyword: str
) -> SplitTower:
    """Wrap the forward of ``model``'s tower at ``module`` (a dotted path), called with its
    grid of patches as ``grid_keyword``, for ``dist``'s cp group; returns the wrapper (its
    ``patches_encoded`` counts this rank's work)."""
    tower = model.get_submodule(module)
    group = dist.cp_mesh.get_group()
    split = SplitTower(tower, tower.forward, dist.cp, dist.cp_rank, group, grid_keyword)
    tower.forward = split
    return split
