"""Activation checkpointing of the sharding units as a policy (state-dict keys unchanged).

Policies, cheapest (least recompute) first:

- ``none``: every activation is kept for backward.
- ``selective``: op-level: inside every unit, the outputs of matmuls and attention kernels
  are saved, the element-wise ops (norms, activations, rotary, residual adds) recomputed.
  Every matmul is saved (torchtitan saves every other one to cut memory further): the
  recompute then costs no matmul FLOPs, which keeps the policy's price near zero and makes
  :func:`recompute_fraction` exact for the FLOPs that matter.
- ``every_n``: every N-th unit (the 1st, the N+1-th, ...) is recomputed whole, the others not.
- ``full``: every unit is recomputed whole; only the units' inputs are kept.

The vision tower and the decoder may take different policies. A chosen unit's ``forward`` is
wrapped (on the instance) in non-reentrant ``torch.utils.checkpoint``: module hooks (FSDP2's)
stay outside the checkpoint, keyword arguments pass through, and ``[training] compile``, which
compiles each unit after this, traces the checkpoint inside the unit's graph.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import types
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, Literal

import attrs

if TYPE_CHECKING:
    import torch

    from ..adapters.base import ParallelPlan

Policy = Literal["none", "full", "every_n", "selective"]

#: Policies from least to most recompute (the order ``memory estimate`` recommends in).
POLICIES: tuple[Policy, ...] = ("none", "selective", "every_n", "full")


def recompute_fraction(policy: Policy, every: int = 2, units: int | None = None) -> float:
    """The fraction of a tower's unit forward FLOPs recomputed in backward under ``policy``.

    ``full``: 1.0; ``every_n``: ``1 / every``, or exactly ``ceil(units / every) / units``
    when the tower's unit count is given (the 1st, N+1-th, ... are recomputed); ``selective``:
    0.0, as matmuls and attention (practically all FLOPs) are saved and only element-wise ops
    recomputed; ``none``: 0.0. A step's hardware FLOPs are its model FLOPs plus this fraction
    of the tower's forward FLOPs (per tower: the vision tower may have its own policy).
    """
    if every < 1:
        raise ValueError(f"every must be >= 1, got {every}")
    if policy == "every_n":
        return -(-units // every) / units if units else 1.0 / every
    return {"none": 0.0, "selective": 0.0, "full": 1.0}[policy]


@functools.cache
def _saved_ops() -> frozenset[Any]:
    """The aten ops whose outputs ``selective`` saves: matmuls, attention, collectives."""
    import torch

    try:  # registers the torch_attn ops
        import torch.nn.attention.varlen
    except ImportError:
        pass
    aten = torch.ops.aten
    names = (
        "mm",
        "addmm",
        "bmm",
        "baddbmm",
        "_grouped_mm",
        "_scaled_mm",
        "_scaled_dot_product_flash_attention",
        "_scaled_dot_product_flash_attention_for_cpu",
        "_scaled_dot_product_efficient_attention",
        "_scaled_dot_product_cudnn_attention",
        "_flash_attention_forward",
        "_efficient_attention_forward",
    )
    ops = {getattr(aten, n).default for n in names if hasattr(aten, n)}
    others = {
        "torch_attn": ("_varlen_attn",),  # torch.nn.attention.varlen (flash_varlen)
        "flash_attn": ("_flash_attn_forward", "_flash_attn_varlen_forward"),  # flash-attn 2
        # recomputing a collective would repeat the communication (torchtitan saves them too)
        "_c10d_functional": ("reduce_scatter_tensor", "all_reduce", "all_to_all_single"),
    }
    for namespace, op_names in others.items():
        space = getattr(torch.ops, namespace)
        ops |= {getattr(space, n).default for n in op_names if hasattr(space, n)}
    return frozenset(ops)


def selective_policy(ctx: Any, op: Any, *args: Any, **kwargs: Any) -> Any:
    """Selective-checkpoint policy: save matmul/attention/collective outputs, recompute
    the rest."""
    from torch.utils.checkpoint import CheckpointPolicy

    if op in _saved_ops():
        return CheckpointPolicy.MUST_SAVE
    return CheckpointPolicy.PREFER_RECOMPUTE


#: Callbacks that see each tensor ``selective`` keeps (set by :func:`observe_selective_saves`
#: for the calling context: the memory profiler's meter, as saved-tensor hooks do not see them).
_OBSERVERS: contextvars.ContextVar[tuple[Callable[[torch.Tensor], None], ...]] = (
    contextvars.ContextVar("hyper_selective_save_observers", default=())
)


@contextlib.contextmanager
def observe_selective_saves(callback: Callable[[torch.Tensor], None]) -> Iterator[None]:
    """Within the block, call ``callback`` on every tensor a ``selective`` unit keeps for
    backward (its cache is no saved tensor, so ``saved_tensors_hooks`` miss it). Eager only:
    ``torch.compile`` takes no other mode in a checkpoint."""
    token = _OBSERVERS.set((*_OBSERVERS.get(), callback))
    try:
        yield
    finally:
        _OBSERVERS.reset(token)


def _observed(
    ctx: contextlib.AbstractContextManager[Any], observers: tuple[Callable[..., None], ...]
) -> contextlib.AbstractContextManager[Any]:
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_leaves

    class ObserveSaves(TorchDispatchMode):
        # pushed after the caching mode, so it sees each op first and the cached output after
        def __torch_dispatch__(
            self, func: Any, types: Any, args: Any = (), kwargs: Any = None
        ) -> Any:
            out = func(*args, **(kwargs or {}))
            if func in _saved_ops():
                for t in tree_leaves(out):
                    if hasattr(t, "untyped_storage"):
                        for observe in observers:
                            observe(t)
            return out

    @contextlib.contextmanager
    def both() -> Iterator[None]:
        with ctx, ObserveSaves():
            yield

    return both()


def _selective_contexts() -> tuple[Any, Any]:
    import torch
    from torch.utils.checkpoint import create_selective_checkpoint_contexts

    forward, recompute = create_selective_checkpoint_contexts(selective_policy)
    observers = _OBSERVERS.get()
    if not observers or torch.compiler.is_compiling():  # compile takes the SAC modes alone
        return forward, recompute
    return _observed(forward, observers), recompute


def checkpointed_units(names: list[str], policy: Policy, every: int = 2) -> list[str]:
    """Which of the units ``names`` (in model order) ``policy`` checkpoints."""
    if policy == "none":
        return []
    if policy == "every_n":
        return [n for i, n in enumerate(names) if i % every == 0]
    return list(names)


@attrs.frozen
class CheckpointedForward:
    """A checkpointed unit's ``forward``: the class's own ``forward`` run under non-reentrant
    ``torch.utils.checkpoint``. Bound to the unit as a method, so a deep copy of the model
    rebinds it to the copy; the policy lives here, not in attributes of the unit."""

    unwrapped: Callable[..., Any]
    policy: Policy

    def __call__(self, unit: torch.nn.Module, *args: Any, **kwargs: Any) -> Any:
        import torch
        from torch.utils.checkpoint import checkpoint

        forward = functools.partial(self.unwrapped, unit)
        # Without gradients (evaluation, generation) there is no backward to replay.
        if not (unit.training and torch.is_grad_enabled()):
            return forward(*args, **kwargs)
        extra = {"context_fn": _selective_contexts} if self.policy == "selective" else {}
        return checkpoint(functools.partial(forward, **kwargs), *args, use_reentrant=False, **extra)


def _checkpoint_forward(module: torch.nn.Module, policy: Policy) -> None:
    if unit_policy(module) != "none":
        return  # applied already
    bound = module.forward  # the class's, or a wrapper's bound to this module before us
    ours = getattr(bound, "__self__", None) is module
    unwrapped = bound.__func__ if ours else type(module).forward
    module.forward = types.MethodType(CheckpointedForward(unwrapped, policy), module)
    # A transformers layer with its own flag set would checkpoint a second time inside ours.
    if getattr(module, "gradient_checkpointing", False):
        module.gradient_checkpointing = False


def split_units(model: torch.nn.Module, plan: ParallelPlan) -> tuple[list[str], list[str]]:
    """The plan's sharding units as ``(decoder, vision)``: vision ones lie in the plan's
    vision encoder."""
    names = plan.match(model)
    prefix = plan.vision_encoder.module + "." if plan.vision_encoder is not None else None
    vision = [n for n in names if prefix is not None and n.startswith(prefix)]
    return [n for n in names if n not in vision], vision


@attrs.frozen
class RecomputeShare:
    """The fraction of each tower's sharding units that backward recomputes whole (``full``
    units; ``selective`` recomputes element-wise work only, which FLOPs do not count)."""

    text: float = 0.0
    vision: float = 0.0


def recompute_share(model: torch.nn.Module, plan: ParallelPlan) -> RecomputeShare:
    """How :func:`apply_activation_checkpointing` left the plan's units, as a
    :class:`RecomputeShare` (for hardware FLOPs: ``FlopsCount.hardware``)."""
    decoder, vision = split_units(model, plan)

    def share(names: list[str]) -> float:
        full = sum(unit_policy(model.get_submodule(n)) == "full" for n in names)
        return full / len(names) if names else 0.0

    return RecomputeShare(text=share(decoder), vision=share(vision))


def apply_activation_checkpointing(
    model: torch.nn.Module,
    plan: ParallelPlan,
    policy: Policy,
    vision_policy: Policy | None = None,
    every: int = 2,
) -> list[str]:
    """Checkpoint the plan's units by ``policy`` (decoder) and ``vision_policy`` (vision
    tower; None: as the decoder); returns the names of the checkpointed units."""
    decoder, vision = split_units(model, plan)
    chosen: list[tuple[str, Policy]] = []
    for names, pol in ((decoder, policy), (vision, vision_policy or policy)):
        whole: Policy = "selective" if pol == "selective" else "full"
        chosen += [(n, whole) for n in checkpointed_units(names, pol, every)]
    for name, how in chosen:
        _checkpoint_forward(model.get_submodule(name), how)
    return [name for name, _ in chosen]


def unit_policy(module: torch.nn.Module) -> Policy:
    """How :func:`apply_activation_checkpointing` left ``module``: ``full`` (recomputed
    whole), ``selective`` or ``none``."""
    wrapped = getattr(module.__dict__.get("forward"), "__func__", None)
    return wrapped.policy if isinstance(wrapped, CheckpointedForward) else "none"
