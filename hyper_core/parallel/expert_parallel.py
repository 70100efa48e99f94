"""Expert parallelism (``[parallel] ep``): each rank of an ``ep`` group holds ``E / ep`` of the
routed experts of every MoE block and computes them for the tokens every rank of its group
routed there.

Layout (:func:`~hyper_core.parallel.setup.expert_parallel_meshes`): the data-parallel ranks
``dp_shard = efsdp × ep`` (``dp_shard × cp`` with ``[parallel] cp``) form a root mesh
``(efsdp, ep)``. Every parameter of a block's
routed-experts module (dim 0 = expert) becomes a DTensor ``Shard(0)`` on the ``ep`` mesh, and
FSDP2 shards these over ``efsdp`` (dim 1) as its own unit; all other weights are FSDP-sharded
over the whole ``dp_shard`` mesh as without EP. Checkpoints (DCP) and exports see the full
``(E, ...)`` tensors, so a checkpoint saved with one ``ep`` resumes with another.

Forward of an experts module (transformers' convention: ``experts(hidden (T, H),
top_k_index (T, k), top_k_weights (T, k)) -> (T, H)``), per MoE block:

1. the ``T·k`` (token, expert) assignments are sorted by expert, so each rank's share is one
   contiguous run, and the counts per expert are exchanged (``all_to_all_single``), then
   brought to the host once (the split sizes);
2. the tokens go to the ranks holding their experts (``all_to_all_single``, uneven splits,
   differentiable), which run the module's own forward (its eager loop or grouped matmul,
   whichever the model's experts implementation is) over their local experts with weight 1;
3. the results come back the same way and are combined with the router weights on the rank
   that routed them, in the order the one-rank forward adds them.

Dropless: every assignment is computed, whatever the imbalance (a rank may receive none).
Gradients of experts, router and inputs flow through both exchanges; the expert gradients are
averaged over the whole data-parallel size, as the other weights (see :class:`_LocalExperts`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import attrs
import torch

from ..errors import ConfigError

if TYPE_CHECKING:
    from ..adapters.base import ModelAdapter, MoEBlock, ParallelPlan
    from .base import ParallelStrategy
    from .env import DistEnv


@attrs.define(kw_only=True)
class ExpertsShard:
    """What the expert-parallel forward of one experts module needs."""

    num_experts: int
    ep: int
    group: Any  # the ep ProcessGroup
    #: The module's class ``forward`` (run over the local experts).
    local_forward: Any


def expert_parallel_plan(
    plan: ParallelPlan,
    model: torch.nn.Module,
    adapter: ModelAdapter,
    strategy: ParallelStrategy,
    dist: DistEnv,
    ep: int,
) -> ParallelPlan:
    """``plan`` with the adapter's MoE blocks to share out over ``ep`` ranks; a
    ``$.parallel.ep`` :class:`ConfigError` when the strategy, world or model cannot."""
    from ..adapters.base import MoEAdapter

    if not getattr(strategy, "expert_parallel", False):
        raise ConfigError(
            [
                (
                    "$.parallel.ep",
                    f"{ep}: strategy {strategy.name!r} has no expert parallelism; use fsdp2",
                )
            ]
        )
    if dist.ep != ep:
        raise ConfigError(
            [("$.parallel.ep", f"{ep} needs at least {ep} ranks, got {dist.world_size}")]
        )
    name = type(model).__name__
    blocks = adapter.moe_blocks(model) if isinstance(adapter, MoEAdapter) else []
    check_expert_parallel(blocks, ep, name)
    return attrs.evolve(plan, moe_blocks=tuple(blocks))


def check_expert_parallel(blocks: list[MoEBlock], ep: int, model_name: str) -> None:
    """Raise a ``$.parallel.ep`` :class:`ConfigError` unless every block's experts split
    evenly over ``ep`` ranks."""
    if not blocks:
        raise ConfigError(
            [("$.parallel.ep", f"{ep}: {model_name} has no MoE blocks to share out; use ep = 1")]
        )
    for block in blocks:
        if block.num_experts < ep or block.num_experts % ep:
            raise ConfigError(
                [
                    (
                        "$.parallel.ep",
                        f"{ep} must divide the {block.num_experts} routed experts of "
                        f"{block.experts} (at most {block.num_experts})",
                    )
                ]
            )


def expert_parameters(module: torch.nn.Module, num_experts: int) -> dict[str, Any]:
    """The experts module's own parameters, each with the experts on dim 0."""
    params = dict(module.named_parameters(recurse=False))
    bad = [n for n, p in params.items() if p.dim() == 0 or p.shape[0] != num_experts]
    nested = [n for n, _ in module.named_parameters() if "." in n]
    if not params or bad or nested:
        raise ConfigError(
            [
                (
                    "$.parallel.ep",
                    f"cannot share out the experts of {type(module).__name__}: expert "
                    "parallelism needs one module holding every routed expert's weights "
                    f"stacked on dim 0 ({num_experts}, ...) (transformers' layout); "
                    + (
                        f"{', '.join(bad)} are not"
                        if bad
                        else f"{', '.join(nested) or 'none'} are in submodules"
                    ),
                )
            ]
        )
    return params


def shard_experts(
    model: torch.nn.Module, blocks: list[MoEBlock], dist: DistEnv, mp_policy: Any
) -> list[torch.nn.Module]:
    """Turn each block's expert weights into ``Shard(0)`` DTensors on the ep mesh, make the
    experts module its own FSDP2 unit over the expert mesh, and route its forward through
    the ep group. Returns the experts modules (before the strategy shards the rest)."""
    import torch
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import DTensor, Shard, distribute_tensor

    def placement(param: torch.nn.Parameter) -> Shard:
        # dim 0 is split over ep already; FSDP2 splits the next one over efsdp
        return Shard(1) if param.dim() > 1 else Shard(0)

    group = dist.ep_mesh.get_group()
    rank_in_group = dist.ep_mesh.get_local_rank()
    modules = []
    for block in blocks:
        module = model.get_submodule(block.experts)
        for name, param in expert_parameters(module, block.num_experts).items():
            if param.is_meta:
                per_rank = block.num_experts // dist.ep
                local = param.detach()[rank_in_group * per_rank : (rank_in_group + 1) * per_rank]
                tensor = DTensor.from_local(local, dist.ep_mesh, [Shard(0)], run_check=False)
            else:
                tensor = distribute_tensor(param.detach(), dist.ep_mesh, [Shard(0)])
            new = torch.nn.Parameter(tensor, requires_grad=param.requires_grad)
            module.register_parameter(name, new)
        shard = ExpertsShard(
            num_experts=block.num_experts,
            ep=dist.ep,
            group=group,
            local_forward=type(module).forward,
        )
        module.forward = _ep_forward(module, shard)
        fully_shard(
            module, mesh=dist.expert_mesh, mp_policy=mp_policy, shard_placement_fn=placement
        )
        modules.append(module)
    return modules


def _ep_forward(module: torch.nn.Module, shard: ExpertsShard) -> Any:
    def forward(
        hidden_states: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor
    ) -> torch.Tensor:
        return ep_experts_forward(module, shard, hidden_states, top_k_index, top_k_weights)

    return forward


class _ScaleGrad(torch.autograd.Function):
    """Identity forward; the gradient times ``scale`` in backward."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, scale: float) -> torch.Tensor:
        ctx.scale = scale
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return grad * ctx.scale, None


class _LocalExperts:
    """The experts module seen with only this rank's experts: the local tensors of its
    DTensor weights and ``num_experts = E / ep``; everything else is the module's.

    The local weights' gradients are divided by ``ep``: each already sums the tokens of the
    whole ep group, and FSDP2 averages only over the ranks holding the same experts
    (``efsdp``, and replicas), so the expert gradients come out averaged over every
    data-parallel rank like the others (FSDP2's ``set_gradient_divide_factor`` would do the
    same, but needs ``PREMUL_SUM``, which gloo lacks).
    """

    def __init__(self, module: torch.nn.Module, num_local: int, ep: int) -> None:
        from torch.distributed.tensor import DTensor

        self.__dict__["_module"] = module
        for name, param in module.named_parameters(recurse=False):
            local = param.to_local() if isinstance(param, DTensor) else param
            self.__dict__[name] = _ScaleGrad.apply(local, 1.0 / ep)
        self.__dict__["num_experts"] = num_local

    def __getattr__(self, name: str) -> Any:
        return getattr(self.__dict__["_module"], name)


def ep_experts_forward(
    module: torch.nn.Module,
    shard: ExpertsShard,
    hidden_states: torch.Tensor,
    top_k_index: torch.Tensor,
    top_k_weights: torch.Tensor,
) -> torch.Tensor:
    """The routed experts' output for ``hidden_states`` (see the module doc)."""
    import torch
    import torch.distributed as tdist

    from .all_to_all import all_to_all

    ep, num_experts = shard.ep, shard.num_experts
    per_rank = num_experts // ep
    top_k = top_k_index.shape[-1]
    flat = top_k_index.reshape(-1)
    order = torch.argsort(flat, stable=True)
    token_of = order // top_k
    counts = torch.zeros(num_experts, dtype=torch.int64, device=flat.device)
    counts.index_add_(0, flat, torch.ones_like(flat, dtype=torch.int64))
    # received[s, e]: assignments rank s of the group sends to this rank's local expert e
    received = torch.empty_like(counts)
    tdist.all_to_all_single(received, counts, group=shard.group)
    send_splits, recv_splits = (
        torch.stack([counts, received]).view(2, ep, per_rank).sum(-1).tolist()
    )  # the one host sync of the block
    tokens = all_to_all(
        hidden_states.index_select(0, token_of), send_splits, recv_splits, shard.group
    )
    local_ids = torch.arange(per_rank, device=flat.device).repeat(ep)
    local_ids = torch.repeat_interleave(local_ids, received).unsqueeze(-1)
    ones = torch.ones(local_ids.shape, dtype=top_k_weights.dtype, device=flat.device)
    local = _LocalExperts(module, per_rank, ep)
    outputs = shard.local_forward(local, tokens, local_ids, ones)
    back = all_to_all(outputs, recv_splits, send_splits, shard.group)
    weights = top_k_weights.reshape(-1).index_select(0, order).unsqueeze(-1)
    combined = torch.zeros_like(hidden_states)
    return combined.index_add_(0, token_of, (back * weights).to(hidden_states.dtype))
