"""``[training] liger_kernel``: liger-kernel's fused Triton kernels in the model.

liger-kernel patches a transformers model instance by its ``model_type``: RMSNorm (and the
vision tower's LayerNorm), (m)RoPE and SwiGLU become single fused kernels, the work
``torch.compile`` would otherwise have to fuse. Its loss patches stay off: the trainer computes
logits at label positions only (:mod:`hyper_core.step.label_positions`). Applied before
activation checkpointing and compile, on the model the adapter built.

Its RoPE patch replaces a function of the transformers modeling module, so it holds for every
model of that type in the process, as liger-kernel documents.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..errors import ConfigError

if TYPE_CHECKING:
    import torch

PATH = "$.training.liger_kernel"
#: What the kernels replace; the loss stays the trainer's.
KERNELS = {
    "rope": True,
    "rms_norm": True,
    "layer_norm": True,
    "swiglu": True,
    "cross_entropy": False,
    "fused_linear_cross_entropy": False,
}


def apply_liger_kernel(model: torch.nn.Module, device: torch.device) -> str:
    """Patch ``model`` in place; returns its model type. A :class:`ConfigError` off CUDA, without
    liger-kernel, or for a model type it has no kernels for."""
    if device.type != "cuda":
        raise ConfigError(
            [(PATH, f"liger-kernel's Triton kernels need CUDA; this run is on {device}")]
        )
    try:
        from liger_kernel.transformers import _apply_liger_kernel_to_instance
        from liger_kernel.transformers.monkey_patch import MODEL_TYPE_TO_APPLY_LIGER_FN
    except ImportError as exc:
        raise ConfigError(
            [(PATH, f"needs liger-kernel ({exc}): pip install 'hyper-train[liger]'")]
        ) from None
    model_type = getattr(model.config, "model_type", None)
    if model_type not in MODEL_TYPE_TO_APPLY_LIGER_FN:
        raise ConfigError([(PATH, f"liger-kernel has no kernels for model type {model_type!r}")])
    _apply_liger_kernel_to_instance(model=model, **KERNELS)
    return model_type
