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


def export_checkpoint(config: Any, host: Any, checkpoint: Path, out_dir: Path) -> Path:
    """Load a DCP checkpoint's model (any number of saving ranks) and write it as HF."""
    import torch.distributed.checkpoint as dcp

    from .builtin.resolve import resolve_adapter
    from .checkpoint import COMPLETE
    from .errors import UserError

    if not (checkpoint / COMPLETE).is_file():
        raise UserError(f"{checkpoint}: not a complete checkpoint")
    adapter = resolve_adapter(config.model, host.registries)
    model = adapter.build_model(config.model, device="cpu")
    state = {"model": model.state_dict()}
    dcp.load(state, checkpoint_id=str(checkpoint))
    model.load_state_dict(state["model"])
    assets = adapter.build_assets(config.model)
    adapter.export_hf(model.state_dict(), model.config, out_dir, assets=assets)
    return out_dir
