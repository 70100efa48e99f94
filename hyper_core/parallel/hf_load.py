"""Loading a sharded model straight from a Hugging Face directory: each rank reads its slices.

With ``fsdp2`` and ``[model] path``, every rank builds the model on the meta device, the
strategy shards and allocates it (each rank holds only its shards), and
:func:`load_hf_shards` fills each rank's shards from the ``*.safetensors`` files: a tensor is
read with safetensors' slicing (``pread``, no memory map, so the pages read are not kept
mapped), one at a time, and only the rows of the rank's shard. No process ever holds the full
model, not even rank 0.

Checkpoint names that differ from module names (a VL model's ``model.language_model`` prefix,
Kimi's per-expert ``experts.{e}.gate_proj`` keys fused into ``experts.gate_up_proj``, ...)
go through transformers' own conversion mapping for the model class, the one
``from_pretrained`` applies, so the loaded weights are exactly what a single-process
``from_pretrained`` gives. transformers 5 slices DTensor parameters on read (its
``DtensorShardOperation``; per-expert tensors a rank does not own are not read at all). That
is right for renames and for conversions that keep dim 0 (stacking experts, concatenating
along a later dim). A conversion that transposes later dims (stacked experts stored transposed)
reads the rank's rows of its sources, converts, and keeps the rank's part; one that reshapes
dim 0 (Kimi's vision ``wqkv`` split into q/k/v and permuted for RoPE) reads its sources whole,
converts, and keeps the rank's part (:func:`_load_whole`): such tensors are small, one at a
time.

The parameters arrive on meta (sharded, no storage): transformers puts a new parameter
holding the rank's shard in each slot, FSDP2 adopts the module's current parameters at its
lazy init (``reset_sharded_param``, the path of ``load_state_dict(assign=True)``), and tied
parameters are tied again (:func:`~hyper_core.parallel.materialize.retie`). Only one copy of
each shard ever exists.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import UserError

if TYPE_CHECKING:
    import torch

    from .env import DistEnv
    from .load_plan import CheckpointView

log = logging.getLogger("hyper_train")

INDEX_FILE = "model.safetensors.index.json"


def weight_files(path: Path) -> list[Path]:
    """The safetensors files of an HF directory: those its index names, else every
    ``*.safetensors``. A file the index names that is missing is a user error."""
    index = path / INDEX_FILE
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (ValueError, KeyError, TypeError) as exc:
            raise UserError(f"$.model.path: {index} is not a safetensors index ({exc})") from None
        files = [path / name for name in sorted(set(weight_map.values()))]
        missing = [f.name for f in files if not f.is_file()]
        if missing:
            raise UserError(
                f"$.model.path: {index.name} names {len(missing)} missing file(s): "
                + ", ".join(missing[:3])
            )
        return files
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise UserError(f"$.model.path: {path} has no *.safetensors weights")
    return files


@contextlib.contextmanager
def _sequential_reads() -> Iterator[None]:
    """Make transformers read one tensor at a time (its thread pool would read every tensor
    of the model ahead of use, holding them all at once)."""
    key = "HF_DEACTIVATE_ASYNC_LOAD"
    old = os.environ.get(key)
    os.environ[key] = "1"
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = old


def load_hf_shards(
    model: torch.nn.Module,
    path: Path,
    dist: DistEnv,
    conversions: list[Any],
    *,
    view: CheckpointView | None = None,
) -> None:
    """Fill the (sharded, materialised) ``model`` with the weights of the HF directory
    ``path``, each rank reading only its slices (collective-free); inside ``view(model)``
    when given (:attr:`LoadPlan.checkpoint_view
    <hyper_core.parallel.load_plan.LoadPlan.checkpoint_view>`: a plugin whose modules differ
    from the checkpoint's shows the checkpoint's tree; what it hides stays on meta).
    """
    with view(model) if view is not None else contextlib.nullcontext():
        _load_hf_shards(model, path, dist, conversions)


def _load_hf_shards(
    model: torch.nn.Module, path: Path, dist: DistEnv, conversions: list[Any]
) -> None:
    """Fill the (sharded, materialised) ``model`` with the weights of the HF directory
    ``path``, each rank reading only its slices (collective-free).

    ``conversions`` map checkpoint names and layouts onto the model's parameters (the
    adapter's ``checkpoint_conversions``, taken before sharding: FSDP2 renames the classes
    transformers looks its mappings up by).

    Every parameter and persistent buffer must come from the checkpoint (tied parameters
    count as loaded); a missing or wrongly shaped one is a :class:`UserError` naming it.
    """
    from safetensors import safe_open
    from transformers.core_model_loading import convert_and_load_state_dict_in_model
    from transformers.modeling_utils import LoadStateDictConfig

    from .materialize import tie_groups

    t0 = time.perf_counter()
    groups = tie_groups(model)
    # transformers makes a loaded (non-DTensor) parameter trainable: keep frozen ones frozen
    trainable = {name: p.requires_grad for name, p in model.named_parameters()}
    files = weight_files(path)
    size = sum(f.stat().st_size for f in files)
    if dist.is_main:
        log.info(
            "loading %s (%d file(s), %.2f GB): each of %d rank(s) reads its own shards",
            path,
            len(files),
            size / 1e9,
            dist.world_size,
        )
    handles = [safe_open(str(f), framework="pt", device="cpu", backend="pread") for f in files]
    try:
        lazy = {key: h.get_slice(key) for h in handles for key in h.keys()}
        sliced, whole = _split_by_conversion(model, lazy, conversions)
        config = LoadStateDictConfig(
            pretrained_model_name_or_path=str(path),
            device_map={"": dist.device},
            weight_mapping=list(conversions),
        )
        with _sequential_reads(), _quiet_transformers():
            info, _ = convert_and_load_state_dict_in_model(model, sliced, config, None)
        _load_whole(model, whole, info)
        _retie(groups)
        for name, param in model.named_parameters():
            if param.requires_grad != trainable.get(name, param.requires_grad):
                param.requires_grad_(trainable[name])
    finally:
        for h in handles:
            h.__exit__(None, None, None)
    _check_complete(model, info, path)
    if dist.is_main:
        log.info("loaded the shards of %s in %.2f s", path, time.perf_counter() - t0)


def _keeps_dim0(converter: Any) -> bool:
    """Whether slicing the sources' rows gives the rows of the converted tensor."""
    from transformers.core_model_loading import Concatenate, MergeModulelist, Transpose

    for op in converter.operations:
        if isinstance(op, MergeModulelist) and op.dim == 0:
            continue
        if isinstance(op, Concatenate) and op.dim >= 1:
            continue
        if isinstance(op, Transpose) and min(op.dim0, op.dim1) >= 1:
            continue
        return False
    return True


def _split_by_conversion(
    model: torch.nn.Module, lazy: dict[str, Any], conversions: list[Any]
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The checkpoint tensors transformers may slice on read, and the conversions (keyed by
    their first target) whose sources must be read whole."""
    from copy import deepcopy
    from functools import partial

    from transformers.core_model_loading import (
        WeightConverter,
        WeightRenaming,
        rename_source_key,
    )

    renamings = [c for c in conversions if isinstance(c, WeightRenaming)]
    converters = [c for c in conversions if isinstance(c, WeightConverter)]
    by_pattern = {p: c for c in converters for p in c.source_patterns}
    targets = model.state_dict()
    sliced: dict[str, Any] = {}
    whole: dict[str, Any] = {}
    for key in sorted(lazy, key=_natural):
        target, pattern = rename_source_key(
            key, renamings, converters, model.base_model_prefix, targets
        )
        converter = by_pattern.get(pattern) if pattern is not None else None
        if converter is None or target not in targets:
            sliced[key] = lazy[key]
            continue
        rows = _dim0_rows(targets[target]) if _keeps_dim0(converter) else None
        if rows is not None and not _transposes(converter):
            sliced[key] = lazy[key]
            continue
        read_rows = rows is not None and len(lazy[key].get_shape()) == targets[target].dim()
        job, _ = whole.setdefault(target, (deepcopy(converter), rows[0] if read_rows else 0))
        if read_rows and _layout_already(converter, lazy[key], targets[target]):
            job.operations = []  # see _layout_already
        if read_rows:
            read = partial(_read_rows, lazy[key], targets[target].dtype, rows)
        else:
            read = partial(_read_whole, lazy[key], targets[target].dtype)
        job.add_tensor(target, key, pattern, read)
    return sliced, whole


def _transposes(converter: Any) -> bool:
    """Whether the conversion permutes dims: transformers' shard-on-read checks the slice's
    shape against the parameter before converting, so these are read (the rank's rows) and
    converted here (e.g. an MoE model's stacked experts, stored ``(E, I, H)`` for
    ``(E, H, I)``)."""
    from transformers.core_model_loading import Transpose

    return any(isinstance(op, Transpose) for op in converter.operations)


def _layout_already(converter: Any, source: Any, target: Any) -> bool:
    """Whether a transpose the converter makes only when the shapes differ (``check_dims``)
    is not needed: the checkpoint already has the module's layout (an export of ours). The
    check itself would compare the rank's rows against the whole parameter, and so
    transpose."""
    ops = converter.operations
    checked = all(getattr(op, "check_dims", False) for op in ops)
    return checked and tuple(source.get_shape()) == tuple(target.shape)


def _dim0_rows(target: Any) -> tuple[int, int] | None:
    """The rows ``[start, stop)`` of dim 0 that this rank's shard of ``target`` lies in (all
    rows for a plain tensor); None when they are not one run (a strided shard) or 0-d."""
    if target.dim() == 0:
        return None
    if not hasattr(target, "device_mesh"):
        return (0, target.shape[0])
    if any(type(p).__name__ == "_StridedShard" for p in target.placements):
        return None
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

    shape, offset = compute_local_shape_and_global_offset(
        target.shape, target.device_mesh, target.placements
    )
    return (offset[0], offset[0] + shape[0])


def _read_rows(source: Any, dtype: Any, rows: tuple[int, int]) -> Any:
    return source[rows[0] : rows[1]].to(dtype=dtype)


def _natural(key: str) -> list[Any]:
    """``layers.2`` before ``layers.10`` (the order transformers collects tensors in)."""
    from transformers.core_model_loading import dot_natural_key

    return dot_natural_key(key)


def _read_whole(source: Any, dtype: Any) -> Any:
    return source[...].to(dtype=dtype)


def _load_whole(model: torch.nn.Module, whole: dict[str, Any], info: Any) -> None:
    """Run each whole-read conversion and keep the rank's part of every tensor it gives."""
    from transformers.core_model_loading import set_param_for_module

    for first, (job, start) in whole.items():
        realized = job.convert(first, model=model, config=model.config, loading_info=info)
        for name, value in realized.items():
            full = value[0] if isinstance(value, list) else value
            module_path, _, leaf = name.rpartition(".")
            module = model.get_submodule(module_path)
            current = module._parameters.get(leaf)
            if current is None:
                current = module._buffers[leaf]
            set_param_for_module(model, name, _rows(current, full, start), info, None)
        del realized


def _rows(target: Any, full: torch.Tensor, start: int = 0) -> torch.Tensor:
    """This rank's part of ``full`` for ``target`` (a DTensor shard, or the whole tensor);
    ``full`` holds the target's rows from ``start`` on."""
    if not hasattr(target, "device_mesh"):
        return full
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

    shape, offset = compute_local_shape_and_global_offset(
        target.shape, target.device_mesh, target.placements
    )
    offset = (offset[0] - start, *offset[1:])
    return full[tuple(slice(o, o + s) for o, s in zip(offset, shape, strict=True))].clone()


def _retie(groups: list[Any]) -> None:
    """Give every slot of a tie group the tensor the load put in one of them."""
    for slots in groups:
        loaded = [getattr(m, kind)[name] for m, kind, name in slots]
        real = [t for t in loaded if not t.is_meta]
        if not real:
            continue  # reported as missing
        for module, kind, name in slots:
            getattr(module, kind)[name] = real[0]


def _check_complete(model: torch.nn.Module, info: Any, path: Path) -> None:
    """One :class:`UserError` for a weight of the wrong shape, a failed conversion or a
    parameter/buffer the checkpoint did not fill; a warning for unused checkpoint weights."""
    if info.mismatched_keys:
        key, got, want = sorted(info.mismatched_keys, key=str)[0]
        raise UserError(
            f"$.model.path: {path}: {key} has shape {tuple(got)} where the model's shard is "
            f"{tuple(want)} (does config.json match the weights?)"
        )
    if info.conversion_errors:
        key, error = next(iter(info.conversion_errors.items()))
        raise UserError(f"$.model.path: {path}: cannot convert {key}: {error}")
    missing = sorted(
        name
        for name, tensor in [*model.named_parameters(), *model.named_buffers()]
        if tensor.is_meta
    )
    if missing:
        more = f" (+{len(missing) - 5} more)" if len(missing) > 5 else ""
        raise UserError(
            f"$.model.path: {path} lacks {len(missing)} weight(s) of the model: "
            + ", ".join(missing[:5])
            + more
        )
    if info.unexpected_keys:
        log.warning(
            "%s has %d weight(s) the model does not use, e.g. %s",
            path,
            len(info.unexpected_keys),
            sorted(info.unexpected_keys)[0],
        )


@contextlib.contextmanager
def _quiet_transformers() -> Iterator[None]:
    """No "Loading weights" progress bar per rank (hyper-train logs the load itself)."""
    from transformers.utils import logging as hf_logging

    enabled = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if enabled:
            hf_logging.enable_progress_bar()
