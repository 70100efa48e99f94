"""QLoRA's frozen base (``[peft] quantize = "nf4"``): the language model's linear weights in
torchao's 4-bit NormalFloat.

Which weights: every ``nn.Linear`` of the adapter's ``language`` part (the whole model when it
has none) that is frozen after LoRA is injected (the LoRA-targeted base layers and the linear
layers LoRA does not target), but not the output head, as QLoRA and transformers' 4-bit
loading do; a weight whose element count is not a multiple of the 64-element block stays as
it was. The vision tower, projector, embeddings and norms stay in ``base_dtype``: the language
model holds most of a VLM's bytes, and the vision tower's error would reach every image token.

Layout of one NF4 weight of ``n`` elements (torchao's ``NF4Tensor``, element size ``e`` of
the dtype it was quantized from): ``n / 2`` bytes of 4-bit codes, one int8 scale per block of
64 (``n / 64``), one factor of size ``e`` per group of ``s`` scales (``s = 256``, the QLoRA
double quantization; fewer when 256 does not divide the block count, as in tiny models), the
scales' mean and the 16-entry code table: :func:`nf4_bytes`, about 0.516 byte per weight.

Each matmul dequantizes the weight to its input's dtype (``base_dtype``, else ``[model]
dtype``); the LoRA weights and their gradients and AdamW state stay fp32.
"""

from __future__ import annotations

import contextlib
import logging
import math
from collections.abc import Iterator
from typing import Any

from hyper_core.errors import ConfigError

from .config import INSTALL_HINT

#: Weights per NF4 block (one int8 scale each).
BLOCK = 64
#: Scales per double-quantization group (one factor each), at most.
SCALER_BLOCK = 256
#: Entries of the NF4 code table each tensor carries.
CODES = 16


def scaler_block(numel: int) -> int:
    """The double-quantization group of a weight of ``numel`` elements: 256 scales, or the
    largest divisor of its block count below that (torchao needs an exact division)."""
    return math.gcd(numel // BLOCK, SCALER_BLOCK)


def nf4_bytes(numel: int, element_size: int) -> int:
    """Bytes of one NF4 weight of ``numel`` elements quantized from ``element_size``-byte
    values: codes, scales, factors, mean and code table (the module doc)."""
    blocks = numel // BLOCK
    return (
        numel // 2
        + blocks
        + blocks // scaler_block(numel) * element_size
        + (1 + CODES) * element_size
    )


def dequantize_peak_bytes(numel: int, element_size: int) -> int:
    """Bytes live at the peak of dequantizing one NF4 weight for a matmul (forward and
    backward): torchao unpacks the two 4-bit halves as int64 codes (``8·n``), looks them up
    and scales them (``2·e·n``) and interleaves them into the weight (``e·n``)."""
    return (8 + 3 * element_size) * numel


def _language_scopes(model: Any, adapter: Any) -> list[str]:
    """Module paths of the adapter's language model ('' for the whole model)."""
    return list(adapter.freeze_groups(model).get("language", [""]))


def nf4_modules(model: Any, adapter: Any) -> list[str]:
    """Names of the linear layers whose weight ``quantize = "nf4"`` stores in NF4 (the
    module doc); ``model`` has LoRA injected, on any device (meta included)."""
    import torch

    scopes = _language_scopes(model, adapter)
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    return [
        name
        for name, module in model.named_modules()
        if isinstance(module, torch.nn.Linear)
        and module is not head
        and not module.weight.requires_grad
        and module.weight.numel() % BLOCK == 0
        and any(not s or name == s or name.startswith(f"{s}.") for s in scopes)
    ]


def nf4_parameter_bytes(model: Any, adapter: Any) -> dict[str, int]:
    """``{parameter name: bytes}`` of the weights :func:`nf4_modules` quantizes, for the
    memory estimate (a model on meta)."""
    return {
        f"{name}.weight": nf4_bytes(w.numel(), w.element_size())
        for name in nf4_modules(model, adapter)
        for w in [model.get_submodule(name).weight]
    }


@contextlib.contextmanager
def _quiet(*loggers: str) -> Iterator[None]:
    """Silence warnings of ``loggers`` (torchao's about its CUDA-only kernels on import)."""
    saved = [(logging.getLogger(n), logging.getLogger(n).level) for n in loggers]
    for logger, _ in saved:
        logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        for logger, level in saved:
            logger.setLevel(level)


def torchao_nf4() -> Any:
    """torchao's ``to_nf4``, or a ``$.peft.quantize`` error with the install hint."""
    try:
        with _quiet("torchao", "torch.utils._pytree"):
            from torchao.quantization import to_nf4
    except ImportError as exc:
        raise ConfigError(
            [("$.peft.quantize", f"nf4 needs torchao ({exc}); {INSTALL_HINT}")]
        ) from None
    return to_nf4


def quantize_base(model: Any, adapter: Any) -> list[str]:
    """Replace the weight of each of :func:`nf4_modules` by its NF4 form (in place, on the
    weight's device; the weights must hold their values). Returns the module names."""
    import torch

    to_nf4 = torchao_nf4()
    names = nf4_modules(model, adapter)
    for name in names:
        module = model.get_submodule(name)
        weight = module.weight.detach().contiguous()
        packed = to_nf4(weight, BLOCK, scaler_block(weight.numel()))
        module.weight = torch.nn.Parameter(packed, requires_grad=False)
    return names


def is_nf4(tensor: Any) -> bool:
    """Whether ``tensor`` is a torchao NF4 weight (without importing torchao)."""
    return type(tensor).__name__ == "NF4Tensor"


def dequantize_base(model: Any) -> int:
    """Replace every NF4 weight of ``model`` by its dequantized values (its original dtype),
    in place. Returns how many there were."""
    import torch

    count = 0
    for module in model.modules():
        for name, param in list(module._parameters.items()):
            if param is not None and is_nf4(param):
                weight = param.get_original_weight()
                module._parameters[name] = torch.nn.Parameter(weight, requires_grad=False)
                count += 1
    return count
