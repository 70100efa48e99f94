"""Writing a model in the Hugging Face layout (safetensors shards + config + tokenizer)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

MAX_SHARD_SIZE = "5GB"


def save_hf_checkpoint(
    state_dict: Mapping[str, torch.Tensor],
    hf_config: Any,
    out_dir: str | Path,
    *,
    model_cls: Any,
    assets: Any = None,
) -> Path:
    """Save ``state_dict`` so that ``model_cls.from_pretrained(out_dir)`` loads it.

    A meta-device instance of ``model_cls`` supplies ``save_pretrained``'s knowledge of tied
    weights and key conversion; no second copy of the weights is made.
    """
    import torch

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    with torch.device("meta"):
        shell = model_cls._from_config(hf_config)
    shell.save_pretrained(
        str(out),
        state_dict=dict(state_dict),
        max_shard_size=MAX_SHARD_SIZE,
        safe_serialization=True,
    )
    if assets is not None:
        assets.save(out)
    return out


def full_state_dict(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The whole model's state dict on rank 0's CPU (collective; other ranks get ``{}``).

    Works for plain, DDP and FSDP2 models: sharded parameters are gathered one at a time and
    offloaded, so no rank holds a full copy on the device.
    """
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    return get_model_state_dict(
        model, options=StateDictOptions(full_state_dict=True, cpu_offload=True)
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


def export_trained_model(trainer: Any, out_dir: Path) -> Path | None:
    """``[checkpoint] export_hf``: gather the trained weights and write ``out_dir`` (rank 0)."""
    import logging
    import time

    t0 = time.perf_counter()
    state = full_state_dict(trainer.model)
    written = None
    if trainer.dist.is_main:
        model = trainer.unwrapped_model
        trainer.adapter.export_hf(state, model.config, out_dir, assets=trainer.assets)
        write_export_record(out_dir, trainer.adapter.name)
        written = out_dir
        logging.getLogger("hyper_train").info(
            "exported the model to %s in %.2f s", out_dir, time.perf_counter() - t0
        )
    trainer.dist.barrier()
    return written


def export_checkpoint(config: Any, host: Any, checkpoint: Path, out_dir: Path) -> Path:
    """Load a DCP checkpoint's model (saved on any number of ranks) and write it as HF.

    One process: the model is built on meta, allocated on the CPU and filled from the
    checkpoint (DCP reshards), so weights at ``[model] path`` are not read.
    """
    import warnings

    import torch.distributed.checkpoint as dcp

    from .builtin.resolve import resolve_adapter
    from .checkpoint import resolve_checkpoint
    from .parallel.materialize import materialize

    checkpoint = resolve_checkpoint(checkpoint)
    adapter = resolve_adapter(config.model, host.registries)
    model = adapter.build_model(config.model, device="meta")
    materialize(model, "cpu")
    state = {"model": model.state_dict()}
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r"torch\.distributed is disabled")
        dcp.load(state, checkpoint_id=str(checkpoint), no_dist=True)
    model.load_state_dict(state["model"])
    assets = adapter.build_assets(config.model)
    adapter.export_hf(model.state_dict(), model.config, out_dir, assets=assets)
    write_export_record(out_dir, adapter.name)
    return out_dir
