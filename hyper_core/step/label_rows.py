"""The last decoder layer at label positions only.

With logits only where labels are (:mod:`.label_positions`), the final hidden state of every
other position is computed and then dropped. In the last decoder layer those positions are
still needed as attention's keys and values, but nothing else they compute there is read:
their queries, the attention's output projection and the MLP act on each token alone and feed
only that token's final hidden state. :func:`install_label_rows` has those per-token modules
(named by :meth:`~hyper_core.adapters.base.ModelAdapter.label_row_modules`) run on the label
rows of the forward's ``logits_to_keep`` mask only, writing zeros at the other rows, which no
loss reads. The label rows get exactly the math of the whole layer (the matrix products have
fewer rows, so the rounding may differ in the last bits); the layer's other rows are garbage.

At 8-40% label tokens this removes most of the last layer's work: about ``1/num_layers`` of the
decoder's. A forward without a boolean ``logits_to_keep`` (generation, export checks, a logits
path) runs the modules whole. The mask is kept until the next forward of the model, so that
activation checkpointing recomputes the layer on the same rows in backward.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch


class LabelRows:
    """The label rows of the model's current forward, and the module wrapper that uses them."""

    def __init__(self) -> None:
        #: ``(batch, seq)`` boolean mask of the current forward's label positions, or None.
        self.mask: torch.Tensor | None = None
        #: The mask's flat indices (one device sync per forward, in the model's pre-hook).
        self.index: torch.Tensor | None = None

    def capture(
        self, module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> None:
        """Forward pre-hook of the model: remember ``logits_to_keep`` when it is a row mask."""
        import torch

        mask = kwargs.get("logits_to_keep")
        if isinstance(mask, torch.Tensor) and mask.dtype == torch.bool and mask.dim() == 2:
            self.mask = mask
            self.index = mask.reshape(-1).nonzero().squeeze(1)
        else:
            self.mask = self.index = None

    def run(
        self, forward: Callable[..., torch.Tensor], x: torch.Tensor, *args: Any, **kwargs: Any
    ) -> torch.Tensor:
        """``forward(x)`` on the label rows of ``x`` (batch, seq, features); zeros elsewhere.
        An input of another shape than the mask's runs whole."""
        mask, index = self.mask, self.index
        if mask is None or index is None or x.dim() != 3 or x.shape[:2] != mask.shape:
            return forward(x, *args, **kwargs)
        rows = x.reshape(-1, x.shape[-1]).index_select(0, index).unsqueeze(0)
        y = forward(rows, *args, **kwargs)
        if not hasattr(y, "shape") or y.dim() != 3 or y.shape[1] != rows.shape[1]:
            raise TypeError(
                "a label-row module must map (batch, seq, features) to (batch, seq, features); "
                f"got {type(y).__name__} (check the adapter's label_row_modules)"
            )
        flat = y.reshape(-1, y.shape[-1])
        # index_put keeps only the index for backward (index_copy would keep ``flat`` too)
        out = flat.new_zeros(x.shape[0] * x.shape[1], y.shape[-1]).index_put((index,), flat)
        return out.reshape(x.shape[0], x.shape[1], y.shape[-1])


def install_label_rows(model: torch.nn.Module, names: list[str]) -> LabelRows | None:
    """Run the submodules ``names`` of ``model`` on the label rows of each forward's
    ``logits_to_keep`` mask; None (nothing installed) when ``names`` is empty.

    Each module's ``forward`` is shadowed by an instance attribute, so parameter names and the
    state dict do not change; the model gets a forward pre-hook that records the mask.
    """
    if not names:
        return None
    rows = LabelRows()
    # Under [training] compile the compiled layer reads the mask and index as inputs reached
    # through its modules; `apply_regional_compile` lets their sizes be symbolic, so new row
    # lengths and label counts reuse the layer's graph.
    for name in names:
        module = model.get_submodule(name)
        module.forward = functools.partial(rows.run, module.forward)
    model.register_forward_pre_hook(rows.capture, with_kwargs=True)
    return rows
