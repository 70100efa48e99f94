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

#: ``hyper-train export --dtype`` choices besides ``auto`` (:func:`export_dtype`).
EXPORT_DTYPES = {"bf16": "bfloat16", "fp32": "float32", "fp16": "float16"}


@attrs.frozen(kw_only=True)
class ExportOptions:
    """The options of ``hyper-train export`` (hook ``export_checkpoint``): the largest shard
    (bytes; None: 5GB), the ``--dtype`` choice, and ``--merge`` (write adapters merged into
    the base model)."""

    max_shard_size: int | None = None
    dtype: str = "auto"
    merge: bool = False


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


def export_dtype(choice: str, adapter: Any, model_config: Any) -> torch.dtype:
    """The dtype an export writes: ``bf16``/``fp32``/``fp16``, or for ``auto`` the dtype in
    ``[model] path``'s config.json, else ``[model] dtype`` (so fp32 master weights trained from
    a bf16 checkpoint are written in bf16)."""
    import torch

    if choice != "auto":
        return getattr(torch, EXPORT_DTYPES[choice])
    source = adapter.hf_config(model_config).dtype if model_config.path is not None else None
    if isinstance(source, str):
        source = getattr(torch, source, None)
    if isinstance(source, torch.dtype) and source.is_floating_point:
        return source
    return getattr(torch, model_config.dtype)


def layout_for(adapter: Any, hf_config: Any, dtype: torch.dtype | None = None) -> CheckpointLayout:
    """``adapter.checkpoint_layout`` of ``hf_config``, its config.json saying ``dtype`` when
    given (on a copy: the model's own config is left as it is)."""
    if dtype is not None:
        import copy

        hf_config = copy.deepcopy(hf_config)
        hf_config.dtype = dtype  # the layout's meta shell, and so config.json, follow it
    return adapter.checkpoint_layout(hf_config)


def _cast(group: Tensors, dtype: torch.dtype | None) -> Tensors:
    """Floating-point tensors of ``group`` in ``dtype`` (integer buffers keep theirs)."""
    if dtype is None:
        return group
    return {k: v.to(dtype) if v.is_floating_point() else v for k, v in group.items()}


def write_hf_export(
    layout: CheckpointLayout,
    groups: Iterable[Tensors],
    out_dir: str | Path,
    *,
    num_groups: int,
    assets: Any = None,
    max_shard_size: str | int | None = None,
    dtype: torch.dtype | None = None,
) -> list[Path]:
    """Convert and write ``groups`` one at a time, then config and assets (one process).

    ``max_shard_size`` defaults to :data:`MAX_SHARD_SIZE` (``save_pretrained``'s "5GB");
    ``dtype`` casts floating-point tensors (None: as they come).
    """
    log = logging.getLogger("hyper_train")
    out = Path(out_dir)
    limit = MAX_SHARD_SIZE if max_shard_size is None else max_shard_size
    writer = ShardedSafetensorsWriter(out, max_shard_size=limit, logger=log)
    for i, group in enumerate(groups, 1):
        writer.progress = f"{i}/{num_groups} groups"
        writer.add(layout.convert(_cast(group, dtype)))
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


#: In an export that does not hold the whole model (e.g. a PEFT adapter directory): the config
#: of the run that trained it, from which ``hyper-train chat`` rebuilds the rest.
EXPORT_RUN_CONFIG = "hyper_train.toml"


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

    Gathering is collective: every rank walks the same keys in the same order, and only rank 0
    ever holds a whole tensor (:func:`_gather_to_main`).
    """
    from torch.distributed.tensor import DTensor

    for keys in groups:
        out: Tensors = {}
        for key in keys:
            tensor = state[key]
            if isinstance(tensor, DTensor):
                tensor = _gather_to_main(tensor)
            if keep and tensor is not None:
                out[key] = tensor.detach().to("cpu")
            del tensor
        yield out


def _gather_to_main(tensor: Any) -> torch.Tensor | None:
    """A DTensor's full value on global rank 0, None elsewhere (a collective).

    Row shards (``Shard(0)``, FSDP2; replicated over other mesh dims, HSDP) are gathered to
    rank 0 within the shard group that holds it, so no other rank materializes the whole
    tensor; other layouts fall back to ``full_tensor`` (an all-gather on every rank).
    """
    import torch.distributed as tdist
    from torch.distributed.tensor import Replicate, Shard

    main = tdist.get_rank() == 0
    mesh, placements = tensor.device_mesh, tensor.placements
    sharded = [i for i, p in enumerate(placements) if not isinstance(p, Replicate)]
    first = placements[sharded[0]] if len(sharded) == 1 else None
    rows_only = type(first) is Shard and first.dim == 0  # not _StridedShard, not Partial
    if not rows_only or not tensor.numel():
        full = tensor.full_tensor()
        return full if main else None
    dim = sharded[0]
    where = (mesh.mesh == 0).nonzero()
    if not len(where):  # a mesh without rank 0 (e.g. another expert group's): not written
        return None
    main_at = [int(i) for i in where[0]]
    mine = mesh.get_coordinate()
    if mine is None or any(c != main_at[d] for d, c in enumerate(mine) if d != dim):
        return None  # a replica group without rank 0: its copy is not needed
    world = mesh.size(dim)
    rows = tensor.shape[0]
    chunk = -(-rows // world)  # torch.chunk's split, which Shard(0) uses
    local = tensor.to_local()
    if local.shape[0] != chunk:  # the last shards may be short or empty
        padded = local.new_zeros((chunk, *local.shape[1:]))
        padded[: local.shape[0]] = local
        local = padded
    local = local.contiguous()
    group, group_dst = mesh.get_group(dim), main_at[dim]
    if not main:
        tdist.gather(local, None, group=group, group_dst=group_dst)
        return None
    out = local.new_empty((chunk * world, *local.shape[1:]))
    tdist.gather(local, list(out.chunk(world)), group=group, group_dst=group_dst)
    return out[:rows] if rows != out.shape[0] else out


def export_trained_model(
    trainer: Any,
    out_dir: Path,
    *,
    max_shard_size: str | int | None = None,
    dtype: torch.dtype | None = None,
) -> Path | None:
    """``[checkpoint] export_hf``: stream the trained weights into ``out_dir`` (rank 0 writes;
    it holds one group and one shard at a time), in ``dtype`` (None: the parameters')."""
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
        layout = layout_for(trainer.adapter, trainer.unwrapped_model.config, dtype)
        write_hf_export(
            layout,
            gathered,
            out_dir,
            num_groups=len(groups),
            assets=trainer.assets,
            max_shard_size=max_shard_size,
            dtype=dtype,
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


def export_at_end(trainer: Any, out_dir: Path) -> Path | None:
    """``[checkpoint] export_hf`` when training ends: a plugin's ``export_checkpoint`` hook of
    the final checkpoint, as ``hyper-train export`` (rank 0; e.g. a LoRA run's PEFT adapter
    directory), else the trained weights streamed in the Hugging Face layout
    (:func:`export_trained_model`, all ranks) in ``[checkpoint] export_dtype``."""
    import torch

    config = trainer.config
    choice = config.checkpoint.export_dtype
    step = trainer.state.global_step
    checkpointer = trainer.checkpointer
    written = None
    if trainer.dist.is_main and checkpointer.last_saved_step == step:
        written = trainer.host.call_stage(
            "export_checkpoint",
            config=config,
            registries=trainer.registries,
            checkpoint=checkpointer.root / f"step-{step}",
            out_dir=out_dir,
            options=ExportOptions(dtype=choice),
        )
    if trainer.dist.any_true(written is not None):  # every rank agrees: a plugin wrote it
        if written is not None:
            logging.getLogger("hyper_train").info("exported the model to %s", written)
        return written
    dtype = None if choice == "auto" else getattr(torch, EXPORT_DTYPES[choice])
    return export_trained_model(trainer, out_dir, dtype=dtype)


def export_checkpoint(
    config: Any,
    host: Any,
    checkpoint: Path,
    out_dir: Path,
    *,
    max_shard_size: str | int | None = None,
    dtype: str = "auto",
) -> Path:
    """Write a DCP checkpoint's model (saved on any number of ranks) as HF, one process.

    The model is built on meta for names, shapes and dtypes only; each group is loaded from the
    checkpoint on its own (DCP reads just the keys asked for), cast to ``dtype``
    (:func:`export_dtype`), written and freed. Weights at ``[model] path`` are not read.
    """
    import warnings

    import torch
    import torch.distributed.checkpoint as dcp

    from .checkpoint import resolve_checkpoint
    from .resolve import resolve_adapter

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

    target = export_dtype(dtype, adapter, config.model)
    write_hf_export(
        layout_for(adapter, model.config, target),
        (load(keys) for keys in groups),
        out_dir,
        num_groups=len(groups),
        assets=adapter.build_assets(config.model),
        max_shard_size=max_shard_size,
        dtype=target,
    )
    write_export_record(out_dir, adapter.name)
    return out_dir
