"""LoRA with a sharded load (``fsdp2`` and ``[model] path``): every rank builds on meta, the
strategy shards, and each rank reads its shards of the checkpoint, which has no LoRA weights.

During the load the model shows its checkpoint's tree (each LoRA layer swapped for its
``base_layer``, :data:`hyper_core.parallel.hf_load.CHECKPOINT_VIEW`), so the base weights load
under their own names and the LoRA parameters stay on meta. :func:`init_lora_shards` then gives
them their values on every rank identically (peft's init, from a generator seeded by the run's
seed, or ``init_from``'s weights) and keeps each rank's rows.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from hyper_core.errors import ConfigError

from .lora import LORA_MARK, saved_name


def lora_layers(model: Any) -> list[tuple[Any, str, Any]]:
    """``(parent, child name, LoRA layer)`` of every peft LoRA layer of ``model``."""
    from peft.tuners.lora import LoraLayer

    found = []
    for module in model.modules():
        for name, child in module.named_children():
            if isinstance(child, LoraLayer):
                found.append((module, name, child))
    return found


@contextlib.contextmanager
def checkpoint_view(model: Any) -> Iterator[None]:
    """The model with each LoRA layer replaced by its ``base_layer`` (restored on exit)."""
    layers = lora_layers(model)
    for parent, name, layer in layers:
        parent._modules[name] = layer.base_layer
    try:
        yield
    finally:
        for parent, name, layer in layers:
            parent._modules[name] = layer


def check_shardable(model: Any) -> None:
    """With a sharded load LoRA goes on linear layers only (their A/B init is known here)."""
    import torch

    for _, _, layer in lora_layers(model):
        if not isinstance(layer.base_layer, torch.nn.Linear):
            raise ConfigError(
                [
                    (
                        "$.peft.target",
                        f"{type(layer.base_layer).__name__} layers cannot take LoRA with "
                        "fsdp2 and [model] path (linear layers only)",
                    )
                ]
            )


def _full_value(name: str, shape: Any, generator: Any, saved: dict[str, Any] | None) -> Any:
    """The unsharded value of the LoRA parameter ``name``: peft's default init (A: Kaiming
    uniform, B: zeros), or the adapter's saved weight."""
    import torch

    if saved is not None:
        if saved_name(name) not in saved:
            raise ConfigError([("$.peft.init_from", f"the adapter lacks {saved_name(name)}")])
        return saved[saved_name(name)]
    if ".lora_B." in name:
        return torch.zeros(shape)
    value = torch.empty(shape)
    bound = 1.0 / math.sqrt(shape[1])  # kaiming_uniform_(a=sqrt(5)), as nn.Linear and peft
    return value.uniform_(-bound, bound, generator=generator)


def _local(target: Any, full: Any) -> Any:
    """This rank's part of ``full`` for the (meta) DTensor ``target``, as a DTensor."""
    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

    if not isinstance(target, DTensor):
        return full
    shape, offset = compute_local_shape_and_global_offset(
        target.shape, target.device_mesh, target.placements
    )
    rows = full[tuple(slice(o, o + s) for o, s in zip(offset, shape, strict=True))]
    return DTensor.from_local(
        rows.contiguous(),
        target.device_mesh,
        target.placements,
        shape=target.shape,
        stride=target.stride(),
        run_check=False,
    )


def init_lora_shards(model: Any, seed: int, device: Any, init_from: Path | None) -> None:
    """Give every LoRA parameter left on meta its value (the same on every rank) on
    ``device``, each rank keeping its shard; FSDP2 adopts the new parameters at its lazy
    init, as it does the loaded ones."""
    import torch

    saved = None
    if init_from is not None:
        from .lora import read_adapter_weights

        saved = read_adapter_weights(init_from)
    generator = torch.Generator().manual_seed(seed)
    for name, param in sorted(model.named_parameters()):
        if LORA_MARK not in name or not param.is_meta:
            continue
        full = _full_value(name, tuple(param.shape), generator, saved)
        if tuple(full.shape) != tuple(param.shape):
            raise ConfigError(
                [
                    (
                        "$.peft.init_from",
                        f"{saved_name(name)} has shape {tuple(full.shape)}, "
                        f"the model's is {tuple(param.shape)} (another r?)",
                    )
                ]
            )
        value = _local(param, full.to(device=device, dtype=param.dtype))
        module_path, _, leaf = name.rpartition(".")
        module = model.get_submodule(module_path)
        module._parameters[leaf] = torch.nn.Parameter(value, requires_grad=param.requires_grad)
