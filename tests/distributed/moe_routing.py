"""A test plugin that routes every token of every MoE block to experts 0 and 1 (skewed
routing: under ``ep = 2`` with 8 experts rank 1 of each group then receives no token at all)."""

from __future__ import annotations

from typing import Any

from hyper_core import hookimpl


def _skew(module: Any, args: Any, output: Any) -> Any:
    import torch

    logits, _, indices = output
    fixed = torch.tensor([0, 1], device=indices.device).expand(indices.shape[0], 2)
    probs = logits.float().softmax(-1).gather(1, fixed)
    weights = (probs / probs.sum(-1, keepdim=True)).to(output[1].dtype)
    return logits, weights, fixed


class SkewedRouting:
    """Registered for a run: hooks the routers of the built model."""

    @hookimpl
    def on_train_begin(self, trainer: Any) -> None:
        for block in trainer.adapter.moe_blocks(trainer.unwrapped_model):
            router = trainer.unwrapped_model.get_submodule(block.router)
            router.register_forward_hook(_skew)
