"""The trained model to answer with: a checkpoint, a run's ``output_dir`` or an export, loaded
as a :class:`~hyper_core.generation.ChatModel` (``hyper-train chat`` and ``predict``)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from .errors import UserError
from .export import EXPORT_RUN_CONFIG
from .generation import ChatModel

if TYPE_CHECKING:
    import torch

    from .adapters.base import ModelAdapter
    from .config import Config
    from .plugins.manager import PluginHost


def is_export_dir(path: Path) -> bool:
    """A Hugging Face model folder: ``config.json`` and safetensors weights."""
    return (path / "config.json").is_file() and any(path.glob("*.safetensors"))


def load_chat_model(
    path: str | Path,
    host: PluginHost,
    *,
    config_path: str | Path | None = None,
    adapter: str | None = None,
    device: str | None = None,
) -> ChatModel:
    """The model of ``path``: an exported folder, a ``checkpoints/step-N`` folder, the
    ``checkpoints/latest`` pointer, or a run's ``output_dir`` (its latest complete checkpoint,
    else its ``hf/`` export).

    A checkpoint (and an export that records its run's config, :data:`EXPORT_RUN_CONFIG`, such
    as a LoRA adapter directory) is loaded by a plugin's ``load_checkpoint_model`` hook, else in
    full by :func:`load_checkpoint_model`. It needs the run's config
    (``output_dir/config.toml``, or ``config.step-M.toml`` of a resumed run, or
    ``config_path``). An export's adapter is ``adapter``, else its run's
    (``output_dir/hf``), else the one that config.json's ``model_type`` names.
    ``device``: default CUDA when available, else the CPU.
    """
    path = Path(path)
    if not path.exists():
        raise UserError(f"{path}: no such checkpoint, run folder or exported model")
    import torch

    from .checkpoint import resolve_checkpoint

    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise UserError(f"--device {device}: CUDA is not available here")
    if is_export_dir(path):
        chat = _load_export(path, host, adapter)
    elif (path / EXPORT_RUN_CONFIG).is_file():
        chat = _load_checkpoint(path, host, config_path or path / EXPORT_RUN_CONFIG)
    else:
        try:
            checkpoint = resolve_checkpoint(path)
        except UserError:
            if path.is_file() and path.name == "latest":
                raise  # names the step it points to
            if is_export_dir(path / "hf"):
                chat = _load_export(path / "hf", host, adapter)
            elif (path / "hf" / EXPORT_RUN_CONFIG).is_file():
                chat = _load_checkpoint(path / "hf", host, path / "hf" / EXPORT_RUN_CONFIG)
            else:
                raise UserError(
                    f"{path}: not a checkpoint, a run's output_dir with one, or an exported "
                    "model (config.json + *.safetensors, or a LoRA adapter directory)"
                ) from None
        else:
            chat = _load_checkpoint(checkpoint, host, config_path)
    chat.model.to(device)
    chat.model.eval()
    return chat


def _load_export(path: Path, host: PluginHost, adapter_name: str | None) -> ChatModel:
    from .config import ModelConfig
    from .resolve import resolve_adapter

    model_config = ModelConfig(path=str(path), adapter=adapter_name or _run_adapter(path))
    adapter = resolve_adapter(model_config, host.registries)
    model = adapter.build_model(model_config)
    return ChatModel(adapter=adapter, model=model, assets=adapter.build_assets(model_config))


def _run_adapter(export: Path) -> str | None:
    """The adapter the export records, else that of the run whose ``output_dir/hf`` is
    ``export`` (config.json's ``model_type`` may name no adapter, e.g. ``qwen2`` for
    ``hf_causal_lm``)."""
    from .config import read_toml
    from .export import read_export_adapter

    recorded = read_export_adapter(export)
    if recorded is not None:
        return recorded

    run_config = export.parent / "config.toml"
    if export.name != "hf" or not run_config.is_file():
        return None
    adapter = read_toml(run_config).get("model", {}).get("adapter")
    return adapter if isinstance(adapter, str) else None


def _load_checkpoint(
    checkpoint: Path, host: PluginHost, config_path: str | Path | None
) -> ChatModel:
    from .checkpoint import COMPLETE, run_config_for
    from .config import load_config

    config_file = Path(config_path) if config_path else run_config_for(checkpoint)
    if config_file is None or not config_file.is_file():
        where = config_file or checkpoint.parent.parent / "config.toml"
        raise UserError(f"{where}: no config found for {checkpoint} (pass --config)")
    config = load_config(config_file, (), host.registries.config_sections)
    loaded = host.call_stage(
        "load_checkpoint_model", config=config, registries=host.registries, checkpoint=checkpoint
    )
    if loaded is None:
        if not (checkpoint / COMPLETE).is_file():
            raise UserError(
                f"{checkpoint}: an export that no installed plugin loads (its run's config "
                f"{config_file} names the plugin that wrote it)"
            )
        loaded = load_checkpoint_model(config, host, checkpoint)
    adapter, model = loaded
    return ChatModel(adapter=adapter, model=model, assets=adapter.build_assets(config.model))


def load_checkpoint_model(
    config: Config, host: PluginHost, checkpoint: Path
) -> tuple[ModelAdapter, torch.nn.Module]:
    """The adapter and the CPU model of a DCP checkpoint (saved on any number of ranks).

    The model is built as configured, then its weights are replaced by the checkpoint's (DCP
    reshards). Built in full rather than on meta: non-persistent buffers (rotary
    frequencies) are not in a checkpoint and must come from the model's own construction.
    """
    import warnings

    import torch.distributed.checkpoint as dcp

    from .resolve import resolve_adapter

    adapter = resolve_adapter(config.model, host.registries)
    model = adapter.build_model(config.model, device="cpu")
    state = {"model": model.state_dict()}
    saved = dcp.FileSystemReader(str(checkpoint)).read_metadata().state_dict_metadata
    missing = [k for k in state["model"] if f"model.{k}" not in saved]
    if missing:
        raise UserError(
            f"{checkpoint}: holds part of the model (not {missing[0]}, {len(missing)} of "
            f"{len(state['model'])} weights missing), e.g. a LoRA run's adapters: load it with "
            "its run's config and the plugin that trained it"
        )
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r"torch\.distributed is disabled")
        dcp.load(state, checkpoint_id=str(checkpoint), no_dist=True)
    model.load_state_dict(state["model"])
    return adapter, model
