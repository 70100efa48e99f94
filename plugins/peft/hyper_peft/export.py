"""``hyper-train export`` of a LoRA run's checkpoint, which holds only the trainable parameters.

Without ``--merge`` it writes a standard PEFT adapter directory (``adapter_config.json``,
``adapter_model.safetensors``, as ``PeftModel.save_pretrained``) that
``PeftModel.from_pretrained(base, DIR)`` loads: only the trained tensors are read, the base
model is built on meta for names and shapes. With ``--merge`` the base (``[model] path``, or
the seeded random init of ``[model] config``) is loaded on the CPU, the adapters are merged
into its weights, and the full model is written in the Hugging Face layout like any export.
The adapter directory also holds the tokenizer/processor files and the run's config
(:data:`hyper_core.export.EXPORT_RUN_CONFIG`), from which ``hyper-train chat`` rebuilds the
base (:func:`trained_model`).
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

from hyper_core.errors import UserError

from .lora import ADAPTER, LORA_MARK, apply_lora, saved_modules, saved_name
from .quantize import dequantize_base, quantize_base

ADAPTER_WEIGHTS = "adapter_model.safetensors"


def _trainable(model: Any) -> dict[str, Any]:
    return {n: p for n, p in model.named_parameters() if p.requires_grad}


def _read_trained(checkpoint: Path, params: dict[str, Any]) -> dict[str, Any]:
    """The checkpoint's values of ``params`` (CPU tensors of their dtypes); a checkpoint that
    lacks one was not trained with this ``[peft]`` section: one error naming it."""
    import torch
    import torch.distributed.checkpoint as dcp

    saved = dcp.FileSystemReader(str(checkpoint)).read_metadata().state_dict_metadata
    missing = [n for n in params if f"model.{n}" not in saved]
    if missing:
        raise UserError(
            f"{checkpoint} lacks {len(missing)} of the {len(params)} weights the run's [peft] "
            f"section trains (e.g. {missing[0]}): export it with the config it was trained with"
        )
    for name, param in params.items():
        shape = tuple(getattr(saved[f"model.{name}"], "size", param.shape))
        if shape != tuple(param.shape):
            raise UserError(
                f"{checkpoint} holds {name} with shape {shape}, the run's [peft] section "
                f"gives {tuple(param.shape)} (another r?): export it with the config it was "
                "trained with"
            )
    part = {n: torch.empty(p.shape, dtype=p.dtype, device="cpu") for n, p in params.items()}
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r"torch\.distributed is disabled")
        dcp.load({"model": part}, checkpoint_id=str(checkpoint), no_dist=True)
    return part


def _dtype(options: Any, adapter: Any, config: Any) -> Any:
    from hyper_core.export import export_dtype

    return export_dtype(options.dtype, adapter, config.model)


def save_adapter_dir(
    trained: dict[str, Any],
    cfg: Any,
    targets: list[str],
    to_save: list[str],
    out_dir: Path,
    base: str | None = None,
) -> Path:
    """Write the trainable tensors ``trained`` (by parameter name of the LoRA-injected model)
    as the PEFT adapter directory ``out_dir``, as ``PeftModel.save_pretrained`` does."""
    from peft import LoraConfig
    from safetensors.torch import save_file

    tensors = {saved_name(n): t.contiguous() for n, t in trained.items()}
    out_dir.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(out_dir / ADAPTER_WEIGHTS), metadata={"format": "pt"})
    LoraConfig(
        r=cfg.r,
        lora_alpha=cfg.alpha,
        lora_dropout=cfg.dropout,
        target_modules=targets,
        modules_to_save=to_save or None,
        use_dora=cfg.method == "dora",
        base_model_name_or_path=base,
    ).save_pretrained(str(out_dir))
    return out_dir


def base_reference(config: Any) -> str | None:
    """``base_model_name_or_path``: ``[model] path`` (absolute when it is a local folder), or
    None for a base built from a named config (random init of ``[run] seed``)."""
    if config.model.path is None:
        return None
    local = Path(config.model.path).expanduser()
    return str(local.resolve()) if local.exists() else str(config.model.path)


def _readme(config: Any, adapter_name: str, base: str | None) -> str:
    from hyper_core.export import EXPORT_RUN_CONFIG

    if base is not None:
        how = (
            f"The base model is `{base}` (`base_model_name_or_path`); with transformers and "
            "peft (the model's own class for a vision-language model):\n\n"
            "```python\nfrom peft import PeftModel\nfrom transformers import "
            "AutoModelForCausalLM\n\nbase = AutoModelForCausalLM.from_pretrained("
            f"{base!r})\nmodel = PeftModel.from_pretrained(base, DIR)\n```\n"
        )
    else:
        how = (
            f"The base model has no weights file: it is adapter `{adapter_name}`'s named config "
            f"`{config.model.config}` with the random init of `[run] seed = {config.run.seed}` "
            "(so `base_model_name_or_path` is null). `hyper-train chat DIR` rebuilds it from "
            f"`{EXPORT_RUN_CONFIG}` (the run's config); `hyper-train export CHECKPOINT --merge` "
            "writes the merged model for other tools.\n"
        )
    return (
        "# LoRA adapters (hyper-train-peft)\n\n"
        "A PEFT adapter directory: `adapter_config.json`, `adapter_model.safetensors`, the "
        f"tokenizer/processor files, and `{EXPORT_RUN_CONFIG}`, the config of the run that "
        "trained it.\n\n" + how + "\n`hyper-train chat DIR` answers with the base and these "
        "adapters.\n"
    )


def write_adapter_dir(
    config: Any, registries: Any, checkpoint: Path, out_dir: Path, options: Any
) -> Path:
    """The PEFT adapter directory of ``checkpoint`` in ``out_dir``, with the tokenizer/
    processor files, the run's config and a README that says how to rebuild the base."""
    from hyper_core.config import dump_config
    from hyper_core.export import EXPORT_RUN_CONFIG, write_export_record
    from hyper_core.resolve import resolve_adapter

    cfg = config.section("peft")
    adapter = resolve_adapter(config.model, registries)
    model = adapter.build_model(config.model, device="meta")
    to_save = saved_modules(model, cfg)
    targets = apply_lora(model, adapter, cfg)
    params = _trainable(model)
    for name in params:  # a tied weight is named after its first module, not the saved one
        if LORA_MARK not in name and not any(name.startswith(f"{m}.") for m in to_save):
            raise UserError(
                f"$.peft.modules_to_save: {name} is tied to a module to save, which a PEFT "
                "adapter directory cannot hold; export the merged model with --merge"
            )
    trained = _read_trained(checkpoint, params)
    dtype = _dtype(options, adapter, config)
    cast = {n: t.to(dtype) if t.is_floating_point() else t for n, t in trained.items()}
    base = base_reference(config)
    save_adapter_dir(cast, cfg, targets, to_save, out_dir, base)
    adapter.build_assets(config.model).save(out_dir)
    (out_dir / EXPORT_RUN_CONFIG).write_text(dump_config(config))
    (out_dir / "README.md").write_text(_readme(config, adapter.name, base))
    write_export_record(out_dir, adapter.name)
    return out_dir


def _read_adapter_dir(path: Path, params: dict[str, Any]) -> dict[str, Any]:
    """``params``' values in the adapter directory ``path`` (one error naming a missing one)."""
    from .lora import read_adapter_weights

    saved = read_adapter_weights(path)
    missing = [n for n in params if saved_name(n) not in saved]
    if missing:
        raise UserError(
            f"{path / ADAPTER_WEIGHTS} lacks {len(missing)} of the {len(params)} weights its "
            f"run's [peft] section trains (e.g. {saved_name(missing[0])})"
        )
    return {n: saved[saved_name(n)] for n in params}


def trained_model(
    config: Any, registries: Any, checkpoint: Path, *, merge: bool = False
) -> tuple[Any, Any]:
    """The adapter and the CPU model of a LoRA run's ``checkpoint`` (a DCP checkpoint or an
    adapter directory): the base rebuilt as the run built it (``[model] path``, or the seeded
    random init of ``[model] config``), LoRA injected (``[peft] base_dtype`` and ``quantize``
    applied) and the trained weights loaded; with ``merge`` the base dequantized and the
    adapters merged into its layers."""
    import torch

    from hyper_core.parallel.setup import seed_everything
    from hyper_core.resolve import resolve_adapter

    cfg = config.section("peft")
    adapter = resolve_adapter(config.model, registries)
    if config.model.path is None:  # the run's base is the seeded init, as setup_distributed
        seed_everything(config.run.seed, config.run.deterministic)
    model = adapter.build_model(config.model, device="cpu")
    apply_lora(model, adapter, cfg)
    if cfg.quantize == "nf4":  # the base the adapters were trained on
        quantize_base(model, adapter)
    params = _trainable(model)
    if (checkpoint / ADAPTER_WEIGHTS).is_file():
        trained = _read_adapter_dir(checkpoint, params)
    else:
        trained = _read_trained(checkpoint, params)
    with torch.no_grad():
        for name, param in params.items():
            param.copy_(trained[name])
        if merge:
            dequantize_base(model)  # an NF4 base: its 4-bit values, in base_dtype
            # a bf16 base ([peft] base_dtype) takes the update in [model] dtype, unrounded
            model.to(getattr(torch, config.model.dtype))
            merge_lora(model)
    return adapter, model


def merge_lora(model: Any) -> None:
    """Merge every LoRA layer of ``model`` into its base layer and put the base layer back
    (in place): the model has its original modules and names again."""
    from .sharded import lora_layers

    for parent, name, layer in lora_layers(model):
        layer.merge(adapter_names=[ADAPTER])
        parent._modules[name] = layer.base_layer


def write_merged(
    config: Any, registries: Any, checkpoint: Path, out_dir: Path, options: Any
) -> Path:
    """The base model with ``checkpoint``'s adapters merged in, in the Hugging Face layout.

    Holds the base model in CPU memory once (``[model] dtype``)."""
    from hyper_core.export import group_keys, layout_for, write_export_record, write_hf_export

    adapter, model = trained_model(config, registries, checkpoint, merge=True)
    dtype = _dtype(options, adapter, config)
    state = model.state_dict()
    groups = group_keys(state)
    write_hf_export(
        layout_for(adapter, model.config, dtype),
        ({k: state[k] for k in keys} for keys in groups),
        out_dir,
        num_groups=len(groups),
        assets=adapter.build_assets(config.model),
        max_shard_size=options.max_shard_size,
        dtype=dtype,
    )
    write_export_record(out_dir, adapter.name)
    return out_dir
