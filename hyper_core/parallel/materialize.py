"""Building the model once (rank 0) and materialising it on every rank.

With more than one rank and a strategy that sets ``meta_init`` (``ddp``, ``fsdp2``):

1. ``build_model``: rank 0 builds the model in full on the CPU, exactly as a single process
   does (random init from the run's seed, or ``from_pretrained`` of ``[model] path``); every
   other rank builds the same architecture on the meta device (no memory, no disk reads).
2. The strategy takes rank 0's weights aside (:func:`take_rank0_source`), which turns rank 0's
   model into a meta model too, applies its wrapping (``fully_shard`` per unit) and allocates
   storage on the device (:func:`materialize`): under FSDP2 each rank allocates its shard only.
3. :func:`load_from_rank0` broadcasts rank 0's full state dict tensor by tensor
   (``set_model_state_dict(full_state_dict=True, broadcast_from_rank0=True)``): each rank keeps
   its slice, so no rank but 0 ever holds a full copy, and rank 0 only on the CPU. Buffers
   (persistent or not, e.g. rotary ``inv_freq``, which no state dict carries) are broadcast too.

Why rank-0 init rather than a seed-identical init on each rank: the weights are then exactly
the single-process weights for the same seed, whatever the number of ranks, and HF
``_init_weights`` logic (which does not know about shards) runs unchanged. The cost is one
broadcast of the model at start-up and a CPU copy on rank 0.

Tied parameters (``lm_head`` = ``embed_tokens``) stay tied: module conversions that replace
parameters (``to("meta")``, ``to_empty``) are followed by re-tying (:func:`tie_groups`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import attrs

if TYPE_CHECKING:
    import torch

    from .env import DistEnv
    from .load_plan import LoadPlan


def build_model_on_rank(
    adapter: Any, model_config: Any, dist: DistEnv, load: LoadPlan
) -> torch.nn.Module:
    """The adapter's model: in full on the CPU, or on meta (:meth:`LoadPlan.build_device`).

    A single process (and a strategy without ``meta_init``) gets the model moved to its device;
    the CPU init keeps random weights a function of the seed only, the same on CPU and GPU.
    """
    model = adapter.build_model(model_config, device=load.build_device(dist.rank))
    if not load.meta_init and dist.device is not None and dist.device.type != "cpu":
        move_to(model, dist.device)
    return model


def move_to(model: torch.nn.Module, device: Any) -> None:
    """``model.to(device)`` with tied parameters kept tied."""
    groups = tie_groups(model)
    model.to(device)
    retie(groups)


# -- tied parameters ---------------------------------------------------------------------------

Slots = list[tuple[Any, str, str]]  # (module, "_parameters" | "_buffers", name)


def tie_groups(model: torch.nn.Module) -> list[Slots]:
    """Parameters and buffers registered under more than one name (e.g. tied embeddings)."""
    by_id: dict[int, Slots] = {}
    for module in model.modules():
        for kind in ("_parameters", "_buffers"):
            for name, tensor in getattr(module, kind).items():
                if tensor is not None:
                    by_id.setdefault(id(tensor), []).append((module, kind, name))
    return [slots for slots in by_id.values() if len(slots) > 1]


def retie(groups: list[Slots]) -> None:
    """Make every slot of each group hold the first slot's tensor again."""
    for (module0, kind0, name0), *rest in groups:
        tensor = getattr(module0, kind0)[name0]
        for module, kind, name in rest:
            getattr(module, kind)[name] = tensor


def materialize(model: torch.nn.Module, device: Any) -> None:
    """Allocate storage for a meta or sharded model on ``device``; ties kept.

    Parameters and persistent buffers are left uninitialised (the caller loads a state dict).
    Non-persistent buffers, which no state dict carries (rotary ``inv_freq``), are recomputed
    (:func:`init_non_persistent_buffers`), so build on meta → ``materialize`` →
    ``load_state_dict`` gives the model a normal build gives.
    """
    groups = tie_groups(model)
    model.to_empty(device=device)
    retie(groups)
    if device != "meta":
        init_non_persistent_buffers(model)


def materialize_buffers(model: torch.nn.Module, device: Any) -> None:
    """Allocate the buffers of a meta model on ``device`` and recompute the non-persistent
    ones; parameters stay on meta (a sharded load creates them shard by shard)."""
    import torch

    for module in model.modules():
        for name, buf in module._buffers.items():
            if buf is not None and buf.is_meta:
                module._buffers[name] = torch.empty_like(buf, device=device)
    init_non_persistent_buffers(model)


def init_non_persistent_buffers(model: torch.nn.Module) -> list[str]:
    """Recompute the non-persistent buffers of ``model`` with the owning HF model's own init.

    Each module holding one goes through ``_init_weights`` of its nearest enclosing
    ``PreTrainedModel`` (transformers ≥ 5 recomputes rotary ``inv_freq`` there). Returns the
    names of the modules no ``_init_weights`` covers (a plain ``nn.Module`` model): their
    non-persistent buffers stay uninitialised and must be copied from a built model.
    """
    import torch

    uncovered: list[str] = []

    def visit(module: torch.nn.Module, prefix: str, owner: Any) -> None:
        if callable(getattr(module, "_init_weights", None)):
            owner = module
        if any(module._buffers.get(n) is not None for n in module._non_persistent_buffers_set):
            if owner is None:
                uncovered.append(prefix)
            else:
                owner._init_weights(module)
        for name, child in module.named_children():
            visit(child, f"{prefix}.{name}" if prefix else name, owner)

    with torch.no_grad():
        visit(model, "", None)
    return uncovered


# -- rank-0 weights ----------------------------------------------------------------------------


@attrs.define(kw_only=True)
class Rank0Source:
    """Rank 0's full weights (CPU), taken off its model before wrapping."""

    state_dict: dict[str, Any]
    buffers: dict[str, Any]


def take_rank0_source(model: torch.nn.Module, dist: DistEnv) -> Rank0Source | None:
    """On rank 0: keep the model's weights aside and leave the model on meta; else None.

    Non-zero ranks must already hold a meta model (``LoadPlan.meta_init``) or any model of
    the same architecture (its values are overwritten).
    """
    if dist.rank != 0:
        return None
    source = Rank0Source(
        state_dict={k: v.detach() for k, v in model.state_dict().items()},
        buffers={k: b.detach() for k, b in model.named_buffers()},
    )
    materialize(model, "meta")
    return source


def load_from_rank0(model: torch.nn.Module, source: Rank0Source | None, dist: DistEnv) -> None:
    """Fill a materialised model (sharded or not) with rank 0's weights and buffers."""
    import torch
    import torch.distributed as tdist
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

    # set_model_state_dict rewrites the dict it is given; pass a shallow copy.
    full = dict(source.state_dict) if source is not None else {}
    set_model_state_dict(
        model,
        full,
        options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=True, strict=True),
    )
    with torch.no_grad():
        for name, buf in model.named_buffers():
            if source is not None:
                buf.copy_(source.buffers[name])
            if dist.world_size > 1:
                tdist.broadcast(buf, src=0)
