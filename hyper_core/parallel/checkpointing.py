"""Activation checkpointing of the sharding units (state-dict keys unchanged)."""

from __future__ import annotations

from typing import Any

from ..adapters.hf import match_modules


def apply_activation_checkpointing(model: Any, plan: Any) -> None:
    """Recompute each sharding unit's activations in backward.

    HF models use their own ``activation_checkpointing_enable`` (non-reentrant); other models get
    their units' ``forward`` wrapped with ``torch.utils.checkpoint``, which keeps parameter names.
    """
    if hasattr(model, "activation_checkpointing_enable"):  # transformers >= 5
        model.activation_checkpointing_enable(
            activation_checkpointing_kwargs={"use_reentrant": False}
        )
        return
    if hasattr(model, "gradient_checkpointing_enable"):
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        return
    import functools

    from torch.utils.checkpoint import checkpoint

    for name in match_modules(model, plan.sharding_units):
        module = model.get_submodule(name)
        forward = module.forward
        module.forward = functools.partial(checkpoint, forward, use_reentrant=False)
