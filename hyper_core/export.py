"""Writing a model in the Hugging Face layout (safetensors shards + config + tokenizer).

The weights stream through in groups (:func:`group_keys`: one transformer layer, or one
module outside the layers): each group is gathered (from FSDP shards) or loaded (from a DCP
checkpoint), converted to the checkpoint's key layout by the adapter's
:class:`CheckpointLayout`, handed to the streaming
:class:`~hyper_core.safetensors_writer.ShardedSafetensorsWriter` and freed, so no process
ever holds the whole model.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import attrs

from .safetensors_writer import MAX_SHARD_SIZE, ShardedSafetensorsWriter

if TYPE_CHECKING:
    import torch

Tensors = dict[str, "torch.Tensor"]


@attrs.frozen
class CheckpointLayout:
    """How an adapter's weights are written: ``convert`` maps one group of native tensors
    (:func:`group_keys`) to the checkpoint's names and tensors (dropping tied copies);
    ``save_config`` writes ``config.json`` (and e.g. ``generation_config.json``) into a
    directory."""

    convert: Callable[[Tensors], Tensors]
    save_config: Callable[[Path], None]


def group_keys(keys: Iterable[str]) -> list[list[str]]:
    """State-dict keys in export groups, in first-appearance order.

    A group is everything under one numbered module (``model.layers.3``,
    ``model.visual.blocks.0``: the fused experts of a layer, the q/k/v of a block, all in
    one), or one module outside numbered ones (``model.embed_tokens``, ``lm_head``).
    """
    groups: dict[str, list[str]] = {}
    for key in keys:
        parts = key.split(".")
        prefix = next(
            (".".join(parts[: i + 1]) for i, p in enumerate(parts[:-1]) if p.isdigit()),
            ".".join(parts[:-1]) or key,
        )
        groups.setdefault(prefix, []).append(key)
    return list(groups.values())


def hf_layout(model_cls: Any, hf_config: Any) -> CheckpointLayout:
    """What ``model_cls.save_pretrained`` writes: tied copies left out, then transformers' own
    reverse weight conversion (``revert_weight_conversion``) applied group by group."""
    import torch
    from transformers.core_model_loading import revert_weight_conversion

    with torch.device("meta"):
        shell = model_cls._from_config(hf_config)
    tied = set(getattr(shell, "all_tied_weights_keys", None) or {})

    def convert(tensors: Tensors) -> Tensors:
        kept = {k: v for k, v in tensors.items() if k not in tied}
        return dict(revert_weight_conversion(shell, kept)) if kept else {}

    def save_config(out: Path) -> None:
        from transformers.dynamic_module_utils import custom_object_save

        shell.config.dtype = str(shell.dtype).split(".")[1]
        shell.config.architectures = [type(shell).__name__]
        if shell.is_remote_code():
            custom_object_save(shell, str(out), config=shell.config)
        shell.config.save_pretrained(str(out))
        if shell.can_generate():
            shell.generation_config.save_pretrained(str(out))

    return CheckpointLayout(convert=convert, save_config=save_config)


def write_hf_export(
    layout: CheckpointLayout,
    groups: Iterable[Tensors],
    out_dir: str | Path,
    *,
    num_groups: int,
    assets: Any = None,
    max_shard_size: str | int | None = None,
) -> list[Path]:
    """Convert and write ``groups`` one at a time, then config and assets (one process).

    ``max_shard_size`` defaults to :data:`MAX_SHARD_SIZE` (``save_pretrained``'s "5GB").
    """
    log = logging.getLogger("hyper_train")
    out = Path(out_dir)
    limit = MAX_SHARD_SIZE if max_shard_size is None else max_shard_size
    writer = ShardedSafetensorsWriter(out, max_shard_size=limit, logger=log)
    for i, group in enumerate(groups, 1):
        writer.progress = f"{i}/{num_groups} groups"
        writer.add(layout.convert(group))
        del group
    files = writer.close()
    layout.save_config(out)
    if assets is not None:
        assets.save(out)
    if len(files) > 1:
        log.info("export: %d shards (%s) renamed to model-*-of-%05d", len(files), out, len(files))
    return files


def export_state_dict(
    adapter: Any,
    state_dict: Mapping[str, torch.Tensor],
    hf_config: Any,
    out_dir: str | Path,
    *,
    assets: Any = None,
    max_shard_size: str | int | None = None,
) -> list[Path]:
    """Write an in-memory state dict through the adapter's layout (tests, small models)."""
    groups = group_keys(state_dict)
    return write_hf_export(
        adapter.checkpoint_layout(hf_config),
        ({k: state_dict[k] for k in keys} for keys in groups),
        out_dir,
        num_groups=len(groups),
        assets=assets,
        max_shard_size=max_shard_size,
    )


#: Written into every export: which adapter wrote it, so ``hyper-train chat`` and other tools
#: need no ``--adapter`` where config.json's ``model_type`` names none (e.g. ``hf_causal_lm``).
EXPORT_RECORD = "hyper_train.json"


def write_export_record(out_dir: Path, adapter_name: str) -> None:
    """Record the adapter of the export in ``out_dir``."""
    import json

    (out_dir / EXPORT_RECORD).write_text(json.dumps({"adapter": adapter_name}) + "\n")


def read_export_adapter(out_dir: Path) -> str | None:
    """The adapter recorded in an export, if any."""
    import json

    try:
        adapter = json.loads((out_dir / EXPORT_RECORD).read_text()).get("adapter")
    except (OSError, ValueError, AttributeError):
        return None
    return adapter if isinstance(adapter, str) else None


def _gathered_groups(
    state: Mapping[str, Any], groups: list[list[str]], keep: bool
) -> Iterator[Tensors]:
    """Each group's full tensors on the CPU where ``keep`` (rank 0), ``{}`` elsewhere.

    ``DTensor.full_tensor`` is a collective: every rank walks the same keys in the same order.
    """
    from torch.distributed.tensor import DTensor

    for keys in groups:
        out: Tensors = {}
        for key in keys:
            tensor = state[key]
            if isinstance(tensor, DTensor):
                tensor = tensor.full_tensor()
            if keep:
                out[key] = tensor.detach().to("cpu")
            del tensor
        yield out


def export_trained_model(
    trainer: Any, out_dir: Path, *, max_shard_size: str | int | None = None
) -> Path | None:
    """``[checkpoint] export_hf``: stream the trained weights into ``out_dir`` (rank 0 writes;
    it holds one group and one shard at a time)."""
    import time

    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    t0 = time.perf_counter()
    # sharded (DTensors under FSDP2): nothing is gathered yet; clean names under DDP/compile
    state = get_model_state_dict(trainer.model, options=StateDictOptions(full_state_dict=False))
    groups = group_keys(state)
    main = trainer.dist.is_main
    gathered = _gathered_groups(state, groups, keep=main)
    written = None
    if main:
        layout = trainer.adapter.checkpoint_layout(trainer.unwrapped_model.config)
        write_hf_export(
            layout,
            gathered,
            out_dir,
            num_groups=len(groups),
            assets=trainer.assets,
            max_shard_size=max_shard_size,
        )
        write_export_record(out_dir, trainer.adapter.name)
        written = out_dir
        logging.getLogger("hyper_train").info(
            "exported the model to %s in %.2f s", out_dir, time.perf_counter() - t0
        )
    else:
        for _ in gathered:
            pass
    trainer.dist.barrier()
    return written


def export_checkpoint(
    config: Any,
    host: Any,
    checkpoint: Path,
    out_dir: Path,
    *,
    max_shard_size: str | int | None = None,
) -> Path:
    """Write a DCP checkpoint's model (saved on any number of ranks) as HF, one process.

    The model is built on meta for names, shapes and dtypes only; each group is loaded from the
    checkpoint on its own (DCP reads just the keys asked for), written and freed. Weights at
    ``[model] path`` are not read.
    """
    import warnings

    import torch
    import torch.distributed.checkpoint as dcp

    from .builtin.resolve import resolve_adapter
    from .checkpoint import resolve_checkpoint

    checkpoint = resolve_checkpoint(checkpoint)
    adapter = resolve_adapter(config.model, host.registries)
    model = adapter.build_model(config.model, device="meta")
    meta = model.state_dict(keep_vars=True)
    saved = set(dcp.FileSystemReader(str(checkpoint)).read_metadata().state_dict_metadata)
    first_name: dict[int, str] = {}
    for key, tensor in meta.items():
        first_name.setdefault(id(tensor), key)
    missing = [k for k in meta if f"model.{first_name[id(meta[k])]}" not in saved]
    if missing:
        from .errors import UserError

        raise UserError(
            f"{checkpoint} holds {len(meta) - len(missing)} of the model's {len(meta)} weights "
            f"(not {missing[0]}): a checkpoint of the trainable parameters only (e.g. LoRA) "
            "cannot be exported as a full model"
        )
    groups = group_keys(meta)

    def load(keys: list[str]) -> Tensors:
        # a tied copy missing from the checkpoint is read under its source's name
        source = {k: k if f"model.{k}" in saved else first_name[id(meta[k])] for k in keys}
        part = {
            source[k]: torch.empty(meta[k].shape, dtype=meta[k].dtype, device="cpu") for k in keys
        }
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=r"torch\.distributed is disabled")
            dcp.load({"model": part}, checkpoint_id=str(checkpoint), no_dist=True)
        return {k: part[source[k]] for k in keys}

    write_hf_export(
        adapter.checkpoint_layout(model.config),
        (load(keys) for keys in groups),
        out_dir,
        num_groups=len(groups),
        assets=adapter.build_assets(config.model),
        max_shard_size=max_shard_size,
    )
    write_export_record(out_dir, adapter.name)
    return out_dir
