"""Context (sequence) parallelism (``[parallel] cp``): the ``cp`` consecutive ranks of a group
read the same packed rows and each runs the decoder on a share of every row's tokens.

Split (:class:`RowSplit`): a row of ``L`` tokens is padded to ``L'``, a multiple of ``2·cp``
(padding: its own sample, labels ignored), cut into ``2·cp`` chunks, and rank ``i`` of the
group keeps chunks ``i`` and ``2·cp-1-i``. Under causal attention a chunk's cost grows with
its position, so this pairing gives every rank the same attention work (the usual causal
load-balancing of ring/Ulysses implementations). Rows shorter than ``cp`` work: a rank may
hold only padding.

Everything before the decoder runs on the whole row on every rank of the group: the
embeddings, the merge of the vision tower's output into ``inputs_embeds`` (the tower itself
runs on a share of the images on each rank, its outputs all-gathered:
:mod:`~hyper_core.parallel.cp_vision`), and the positions, multimodal (3-D) ones included
(the packed runtime computes them per sample on the host). A forward pre-hook on the decoder
(``get_decoder()``) then keeps this rank's tokens of ``input_ids``/``inputs_embeds`` and
``position_ids`` (so every token keeps its position) and of the model's other per-token
inputs (the adapter's :meth:`ContextParallelAdapter.split_decoder_kwargs
<hyper_core.adapters.ContextParallelAdapter.split_decoder_kwargs>`), and gives the layers
the whole padded row's sample boundaries (``cu_seq_lens_*``).

Expert parallelism composes: the MoE blocks are token-wise, so a rank's ep group exchanges
the tokens it holds, whichever cp group the ranks are in (the ep groups are cut from the
same ``dp_shard × cp`` ranks, :func:`~hyper_core.parallel.setup.expert_parallel_meshes`).

Attention (Ulysses, :meth:`ContextParallel.attention`, called by ``varlen`` for the decoder's
attention modules): an all-to-all over heads gives each rank every token of the row for
``heads / cp`` heads (and ``kv_heads / cp`` key/value heads), it runs the ``varlen``
attention over the whole row with the sample boundaries, and a second all-to-all sends the
outputs back to the tokens' ranks. It is exact (the same per-sample SDPA as one rank) and
costs two all-to-alls of the activations per layer; it needs ``cp`` to divide the head
counts. Ring attention (exchanging key/value blocks) has no such limit but must merge
partial softmaxes per sample across ranks, which the per-sample ``varlen`` loop does not
do; it can come later for models whose head counts ``cp`` does not divide.

Loss and gradients: the trainer splits the labels the same way, normalises by the step's
loss tokens counted once per row (the group's ranks see the same rows), and scales the loss
by the world size: FSDP2 averages gradients over its whole mesh, the ``cp`` ranks included,
and each rank's loss is a *partial* sum of its group's loss, so the average × world size is
the sum of every rank's partial loss gradients: the one-rank gradient. Evaluation runs
unsplit (a module in eval mode is not split): each rank of a group evaluates the whole rows.
"""

from __future__ import annotations

from collections.abc import Callable
from itertools import pairwise
from typing import TYPE_CHECKING, Any

import attrs

from ..errors import ConfigError

if TYPE_CHECKING:
    import torch

    from ..adapters.base import ContextParallelAdapter
    from ..batching.types import MicroBatch
    from .env import DistEnv


@attrs.frozen
class RowSplit:
    """Which tokens of a row rank ``rank`` of a ``cp`` group keeps (see the module doc)."""

    cp: int
    rank: int

    def padded_length(self, length: int) -> int:
        """``length`` rounded up to a multiple of ``2·cp`` (at least ``2·cp``)."""
        step = 2 * self.cp
        return max(step, -(-length // step) * step)

    def local_index(self, length: int, device: Any = None) -> torch.Tensor:
        """Positions in the padded row of this rank's tokens: chunks ``rank`` and
        ``2·cp-1-rank``."""
        import torch

        chunk = self.padded_length(length) // (2 * self.cp)
        first = self.rank * chunk
        second = (2 * self.cp - 1 - self.rank) * chunk
        return torch.cat(
            [
                torch.arange(first, first + chunk, device=device),
                torch.arange(second, second + chunk, device=device),
            ]
        )

    def take(self, x: torch.Tensor, dim: int, pad: torch.Tensor | float) -> torch.Tensor:
        """This rank's tokens of ``x`` along ``dim`` (the row's length), after padding it
        with ``pad`` (a value, or a tensor of the padding's shape)."""
        import torch

        dim = dim % x.dim()
        length = x.shape[dim]
        extra = self.padded_length(length) - length
        if extra:
            if not isinstance(pad, torch.Tensor):
                shape = list(x.shape)
                shape[dim] = extra
                pad = x.new_full(shape, pad)
            x = torch.cat([x, pad.to(device=x.device, dtype=x.dtype)], dim=dim)
        return x.index_select(dim, self.local_index(length, x.device))

    def marked_rows(self, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """This rank's share of a ``(batch, length)`` boolean token ``mask``, and the indices
        (into tensors with one row per marked token, in row-major order) of the rows of its
        marked tokens, in the same order (the local positions keep the row's order)."""
        import torch

        ordinal = torch.cumsum(mask.reshape(-1).long(), 0).reshape(mask.shape) - 1
        local_mask = self.take(mask, 1, False)
        return local_mask, self.take(ordinal, 1, -1)[local_mask]

    def padded_bounds(self, bounds: list[int], batch: int, length: int) -> list[int]:
        """Sample boundaries over ``batch`` padded rows from those over ``batch·length``
        tokens; each row's padding is a sample of its own."""
        padded = self.padded_length(length)
        out = {batch * padded}
        for b in bounds:
            row, offset = divmod(b, length)
            out.add(row * padded + offset)
        for row in range(batch):
            out.update((row * padded, row * padded + length))
        return sorted(out)


@attrs.define
class ContextParallel:
    """This rank's context-parallel group: splits rows and runs the decoder's attention."""

    split: RowSplit
    group: Any  # the cp ProcessGroup
    #: Splits the model's other per-token decoder inputs; None: there are none.
    adapter: ContextParallelAdapter | None = None

    @property
    def cp(self) -> int:
        """The group's size."""
        return self.split.cp

    def mark_attention_call(
        self, module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> tuple[tuple[Any, ...], dict[str, Any]] | None:
        """An attention module's forward pre-hook: in training, its attention function gets
        this group (:data:`~hyper_core.attention.varlen.CONTEXT_PARALLEL_KWARG`), which the
        module passes on with its other keyword arguments. A hook, not an attribute: the
        state stays with the run's hooks, and an activation-checkpointing recompute calls the
        module again, so the hook again."""
        from ..attention.varlen import CONTEXT_PARALLEL_KWARG

        if not module.training:
            return None
        return args, {**kwargs, CONTEXT_PARALLEL_KWARG: self}

    def split_decoder_inputs(
        self, module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> tuple[tuple[Any, ...], dict[str, Any]] | None:
        """The decoder's forward pre-hook: this rank's tokens, every token's position, the
        whole padded row's boundaries. Not in eval mode (evaluation is not split)."""
        import torch

        if not module.training:
            return None
        if args:
            raise RuntimeError("context parallelism needs the decoder called with keywords")
        if kwargs.get("attention_mask") is not None:
            raise ConfigError(
                [
                    (
                        "$.parallel.cp",
                        f"{self.cp} needs packed rows without an attention mask "
                        '([data] batching = "packed")',
                    )
                ]
            )
        name = "inputs_embeds" if kwargs.get("inputs_embeds") is not None else "input_ids"
        x = kwargs[name]
        batch, length = x.shape[0], x.shape[1]
        bounds = self.split.padded_bounds(self._bounds(kwargs, batch, length), batch, length)
        out = dict(kwargs)
        out[name] = self.split.take(x, 1, 0)
        positions = kwargs.get("position_ids")
        if positions is not None:
            extra = self.split.padded_length(length) - length
            pad = torch.arange(extra, device=positions.device).expand(*positions.shape[:-1], -1)
            out["position_ids"] = self.split.take(positions, -1, pad)
        if self.adapter is not None:
            out.update(self.adapter.split_decoder_kwargs(kwargs, self.split))
        longest = max(b - a for a, b in pairwise(bounds))
        cu = torch.tensor(bounds, dtype=torch.int32, device=x.device)
        out.update(cu_seq_lens_q=cu, cu_seq_lens_k=cu, max_length_q=longest, max_length_k=longest)
        return args, out

    @staticmethod
    def _bounds(kwargs: dict[str, Any], batch: int, length: int) -> list[int]:
        """The sample boundaries over the ``batch·length`` tokens of the unsplit rows."""
        from ..attention.varlen import cu_bounds, packed_bounds

        cu = kwargs.get("cu_seq_lens_q")
        if cu is not None:
            return cu_bounds(cu)
        positions = kwargs.get("position_ids")
        if positions is not None and positions.dim() == 3:
            # mRoPE: (3, B, L) has no per-sample text positions; (4, B, L) has them first
            positions = positions[0] if positions.shape[0] == 4 else None
        found = packed_bounds(positions, batch, length) if positions is not None else None
        return found or [row * length for row in range(batch + 1)]

    def attention(
        self,
        fn: Callable[..., tuple[torch.Tensor, Any]],
        module: torch.nn.Module,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        attention_mask: torch.Tensor | None,
        **kwargs: Any,
    ) -> tuple[torch.Tensor, None]:
        """Ulysses: ``fn`` (an attention function) over the whole row for this rank's heads;
        ``(B, L/cp, H, Dv)`` for this rank's tokens."""
        kwargs.pop("position_ids", None)  # this rank's; the boundaries are the whole row's
        out, _ = fn(
            module,
            self._gather_row(query),
            self._gather_row(key),
            self._gather_row(value),
            attention_mask,
            **kwargs,
        )
        return self._scatter_row(out), None

    def _gather_row(self, x: torch.Tensor) -> torch.Tensor:
        """``(B, H, L/cp, D)`` of this rank's tokens → ``(B, H/cp, L', D)`` of the row."""
        import torch

        from .all_to_all import all_to_all

        n = self.cp
        batch, heads, local, dim = x.shape
        send = x.reshape(batch, n, heads // n, local, dim).transpose(0, 1).contiguous()
        got = all_to_all(send, None, None, self.group)  # [source rank]
        got = got.reshape(n, batch, heads // n, 2, local // 2, dim)
        # rank s sent chunks s and 2n-1-s: chunks 0..n-1 in rank order, then n..2n-1 reversed
        chunks = torch.cat([got[:, :, :, 0], got[:, :, :, 1].flip(0)])
        return chunks.permute(1, 2, 0, 3, 4).reshape(batch, heads // n, n * local, dim)

    def _scatter_row(self, out: torch.Tensor) -> torch.Tensor:
        """``(B, L', H/cp, Dv)`` of the row → ``(B, L/cp, H, Dv)`` of this rank's tokens."""
        import torch

        from .all_to_all import all_to_all

        n = self.cp
        batch, length, heads, dim = out.shape
        chunk = length // (2 * n)
        chunks = out.reshape(batch, 2 * n, chunk, heads, dim)
        send = torch.stack([chunks[:, :n], chunks[:, n:].flip(1)], dim=2)  # [dest rank] on 1
        send = send.transpose(0, 1).contiguous()
        got = all_to_all(send, None, None, self.group)  # [source = heads]
        return got.permute(1, 2, 3, 0, 4, 5).reshape(batch, 2 * chunk, n * heads, dim)


def split_micro_batch(micro_batch: MicroBatch, dist: DistEnv) -> MicroBatch:
    """``micro_batch`` with only this rank's labels, padded rows ignored (the decoder's
    pre-hook splits the model inputs the same way)."""
    from ..batching.types import IGNORE_INDEX

    labels = RowSplit(dist.cp, dist.cp_rank).take(
        micro_batch.loss_inputs["labels"], 1, IGNORE_INDEX
    )
    return attrs.evolve(micro_batch, loss_inputs={**micro_batch.loss_inputs, "labels": labels})


def install_context_parallel(
    model: torch.nn.Module, dist: DistEnv, adapter: ContextParallelAdapter | None = None
) -> ContextParallel:
    """Split ``model``'s decoder over ``dist``'s cp group (see the module doc), the model's
    other per-token inputs by ``adapter``; a ``$.parallel.cp`` :class:`ConfigError` when its
    heads do not split evenly."""
    cp = dist.cp
    decoder = model.get_decoder() if hasattr(model, "get_decoder") else None
    if decoder is None:
        raise ConfigError(
            [("$.parallel.cp", f"{cp}: {type(model).__name__} has no decoder (get_decoder)")]
        )
    config = decoder.config
    heads = getattr(config, "num_attention_heads", None)
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    if not heads or heads % cp or kv_heads % cp:
        raise ConfigError(
            [
                (
                    "$.parallel.cp",
                    f"{cp} must divide the {heads} attention heads and {kv_heads} key/value "
                    f"heads of {type(model).__name__} (Ulysses splits the heads over the cp "
                    "ranks)",
                )
            ]
        )
    layers = [m for m in decoder.modules() if type(m).__name__.endswith("Attention")]
    if not layers:
        raise ConfigError(
            [("$.parallel.cp", f"{cp}: found no attention module in {type(decoder).__name__}")]
        )
    state = ContextParallel(RowSplit(cp, dist.cp_rank), dist.cp_mesh.get_group(), adapter)
    for layer in layers:
        layer.register_forward_pre_hook(state.mark_attention_call, with_kwargs=True)
    decoder.register_forward_pre_hook(state.split_decoder_inputs, with_kwargs=True)
    return state
