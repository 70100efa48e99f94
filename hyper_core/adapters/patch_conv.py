"""Patch-embedding convolutions as one matrix product.

Vision towers embed patches with a ``Conv2d``/``Conv3d`` whose stride equals its kernel, and
several (Qwen-VL, Kimi) call it on inputs that are already single patches, ``(N, C, *kernel)``:
a degenerate convolution with a 1×1(×1) output, which is the linear map
``x.flatten(1) @ weight.flatten(1).T``. Convolution kernels are slow at this shape: on this
project's 2-core CPU a Qwen2.5-VL demo patch embedding takes 20 ms forward + backward as a
``Conv3d`` and 13 ms as a matmul, and cuDNN is known to be far slower still for it in bf16
(transformers issue #45750).

:func:`use_patchwise_convs` swaps the class of such modules for a subclass whose ``forward``
takes the matmul path on single-patch inputs and the convolution otherwise. The parameters stay
the module's own (same names and shapes), so checkpoints, sharding and export do not change.
transformers' experimental ``fusion_config={"patch_embeddings": True}`` does the same at
load time, but it renames the weight (``patch_embed.linear_proj``) and patches classes
globally; this keeps the checkpoint layout. The module imports torch: import it lazily.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F


def _is_patchwise(conv: Any) -> bool:
    """Non-overlapping and dense: each output is one kernel-sized patch times the weight."""
    dims = len(conv.kernel_size)
    return (
        tuple(conv.stride) == tuple(conv.kernel_size)
        and tuple(conv.dilation) == (1,) * dims
        and conv.groups == 1
        and conv.padding_mode == "zeros"
        and (conv.padding == "valid" or tuple(conv.padding) == (0,) * dims)
    )


def _patchwise_forward(conv: Any, input: torch.Tensor) -> torch.Tensor | None:
    """The convolution as a matmul when ``input`` is ``(N, C, *kernel)``, else None."""
    kernel = tuple(conv.kernel_size)
    if input.dim() != len(kernel) + 2 or tuple(input.shape[2:]) != kernel:
        return None
    weight = conv.weight
    out = F.linear(
        input.reshape(input.shape[0], -1), weight.reshape(weight.shape[0], -1), conv.bias
    )
    return out.reshape(*out.shape, *(1,) * len(kernel))


class PatchwiseConv2d(torch.nn.Conv2d):
    """A ``Conv2d`` with stride = kernel that multiplies single-patch inputs as a matmul."""

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        out = _patchwise_forward(self, input)
        return super().forward(input) if out is None else out


class PatchwiseConv3d(torch.nn.Conv3d):
    """A ``Conv3d`` with stride = kernel that multiplies single-patch inputs as a matmul."""

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        out = _patchwise_forward(self, input)
        return super().forward(input) if out is None else out


_PATCHWISE: dict[type, type] = {torch.nn.Conv2d: PatchwiseConv2d, torch.nn.Conv3d: PatchwiseConv3d}


def use_patchwise_convs(model: torch.nn.Module) -> list[str]:
    """Give every plain non-overlapping ``Conv2d``/``Conv3d`` of ``model`` the matmul path for
    single-patch inputs; returns the names of the modules changed (meta modules too)."""
    changed = []
    for name, module in model.named_modules():
        patchwise = _PATCHWISE.get(type(module))  # exact type: custom subclasses are left alone
        if patchwise is not None and _is_patchwise(module):
            module.__class__ = patchwise
            changed.append(name)
    return changed
