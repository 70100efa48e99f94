"""A differentiable all-to-all of rows over a process group, on ``torch.distributed``'s eager
``all_to_all_single``: what expert parallelism, context parallelism and encoder parallelism
exchange (one implementation for the three).

Eager, not torch's functional ``all_to_all_single_autograd``: on gloo (torch 2.13) a process
group that ran a functional collective outlives ``destroy_process_group()`` with its threads
(see :mod:`hyper_core.parallel.exit`); the eager collective leaves nothing behind.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from torch.distributed import ProcessGroup


class _AllToAll(torch.autograd.Function):
    """Rows to the other ranks; backward sends the received rows' gradients back."""

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any,
        x: torch.Tensor,
        send_rows: Sequence[int] | None,
        recv_rows: Sequence[int] | None,
        group: ProcessGroup | None,
    ) -> torch.Tensor:
        ctx.send_rows, ctx.recv_rows, ctx.group = send_rows, recv_rows, group
        return _exchange(x, send_rows, recv_rows, group)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None, None]:
        return _exchange(grad, ctx.recv_rows, ctx.send_rows, ctx.group), None, None, None


def _exchange(
    x: torch.Tensor,
    send_rows: Sequence[int] | None,
    recv_rows: Sequence[int] | None,
    group: ProcessGroup | None,
) -> torch.Tensor:
    import torch.distributed as dist

    rows = x.shape[0] if recv_rows is None else sum(recv_rows)
    out = x.new_empty((rows, *x.shape[1:]))
    dist.all_to_all_single(
        out,
        x.contiguous(),
        output_split_sizes=None if recv_rows is None else list(recv_rows),
        input_split_sizes=None if send_rows is None else list(send_rows),
        group=group,
    )
    return out


def all_to_all(
    x: torch.Tensor,
    send_rows: Sequence[int] | None,
    recv_rows: Sequence[int] | None,
    group: ProcessGroup | None,
) -> torch.Tensor:
    """Send ``send_rows[r]`` consecutive rows (dim 0) of ``x`` to rank ``r`` of ``group`` and
    receive ``recv_rows[r]`` from it, in rank order; None: equal shares of ``x``'s rows.
    Differentiable: the gradient of each received row goes back to its sender."""
    return _AllToAll.apply(x, send_rows, recv_rows, group)
