"""The peft plugin's hook implementations (entry point ``peft``).

Imports neither torch nor peft. A run that sets ``[peft] method`` gets a :class:`PeftRun`
(from ``build_callbacks``), which wraps ``build_model`` to inject LoRA into the model the stage
returns (before ``parallelize_model``, so the strategy shards and wraps the adapters with their
layers) and builds the run's checkpointer with ``trainable_only``: checkpoints hold the
adapters and their optimizer state, the base comes from ``[model] path`` or the seed at every
start.
"""

from __future__ import annotations

import logging
from collections.abc import Generator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import attrs

from hyper_core import hookimpl
from hyper_core.errors import ConfigError

if TYPE_CHECKING:
    from hyper_core.parallel.load_plan import LoadPlan

SECTION = "peft"
log = logging.getLogger("hyper_train.peft")


@hookimpl
def register_config_sections(register: Any) -> None:
    """``[peft]``."""
    register(SECTION, "hyper_peft.config:PeftConfig")


@hookimpl
def build_callbacks(config: Any, dist: Any) -> PeftRun | None:
    """A :class:`PeftRun` when ``[peft] method`` is set."""
    cfg = config.section(SECTION)
    if cfg is None or not cfg.enabled:
        return None
    if cfg.quantize != "none" and dist.world_size > 1:
        # the NF4 weights are made after the load, which several ranks do through rank 0's
        # broadcast (ddp, fsdp2) or sharded reads (fsdp2): neither carries NF4 tensors yet
        raise ConfigError(
            [
                (
                    "$.peft.quantize",
                    f"{cfg.quantize} runs on one process only, not on {dist.world_size} ranks "
                    f'([parallel] strategy = "{config.parallel.strategy}"); use '
                    'base_dtype = "bfloat16" without quantize on several ranks',
                )
            ]
        )
    if config.checkpoint.export_hf and not config.checkpoint.save_final:
        # export_hf writes the adapter directory from the final checkpoint (export_checkpoint)
        raise ConfigError(
            [
                (
                    "$.checkpoint.export_hf",
                    "with [peft] it exports the final checkpoint, which save_final = false "
                    "does not write: set save_final = true, or export a checkpoint with "
                    "`hyper-train export CHECKPOINT --out DIR`",
                )
            ]
        )
    return PeftRun(cfg, config)


@hookimpl
def export_checkpoint(
    config: Any, registries: Any, checkpoint: Path, out_dir: Path, options: Any
) -> Path | None:
    """A LoRA run's checkpoint: the PEFT adapter directory, or with ``--merge`` the merged
    model in the Hugging Face layout (:mod:`hyper_peft.export`)."""
    cfg = config.section(SECTION)
    if cfg is None or not cfg.enabled:
        return None
    from .export import write_adapter_dir, write_merged

    write = write_merged if options.merge else write_adapter_dir
    return write(config, registries, checkpoint, out_dir, options)


@hookimpl
def load_checkpoint_model(config: Any, registries: Any, checkpoint: Path) -> tuple[Any, Any] | None:
    """A LoRA run's checkpoint or adapter directory: the base rebuilt as the run built it, with
    the trained adapters (:func:`hyper_peft.export.trained_model`)."""
    cfg = config.section(SECTION)
    if cfg is None or not cfg.enabled:
        return None
    from .export import trained_model

    return trained_model(config, registries, checkpoint)


class PeftRun:
    """One LoRA run: injects the adapters and checkpoints only the trainable parameters."""

    def __init__(self, cfg: Any, config: Any) -> None:
        self.cfg = cfg
        self.config = config
        self.targets: list[str] = []
        #: Whether the LoRA parameters await their values after a sharded load.
        self.init_after_load = False

    @hookimpl(wrapper=True)
    def plan_load(self) -> Generator[None, LoadPlan, LoadPlan]:
        """A sharded load reads the base layers through :func:`~hyper_peft.sharded.
        checkpoint_view`; DoRA's magnitudes are the base weights' norms, so with DoRA rank 0
        loads and broadcasts instead."""
        plan = yield
        if not plan.sharded_load:
            return plan
        if self.cfg.method == "dora":
            log.info("dora: [model] path is loaded on rank 0 and broadcast (no sharded load)")
            return attrs.evolve(plan, sharded_load=False)
        from .sharded import checkpoint_view

        return attrs.evolve(plan, checkpoint_view=checkpoint_view)

    @hookimpl(wrapper=True)
    def build_model(self, adapter: Any, dist: Any, load: LoadPlan) -> Generator[None, Any, Any]:
        """LoRA into the built model, on whatever device it was built (CPU or meta): on
        several ranks rank 0's adapters are broadcast with the base like any weight."""
        from .lora import apply_lora, load_adapter_weights

        model = yield
        self.targets = apply_lora(model, adapter, self.cfg)
        if self.cfg.quantize == "nf4":
            from .quantize import quantize_base

            quantized = quantize_base(model, adapter)
            if dist.is_main:
                log.info("nf4: %d frozen linear layer(s) stored in 4 bits", len(quantized))
        if load.sharded_load:
            from .sharded import check_shardable

            check_shardable(model)
            self.init_after_load = True
        elif self.cfg.init_from is not None and not _is_meta(model):
            load_adapter_weights(model, self._init_from())
        if dist.is_main:
            trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
            total = sum(p.numel() for p in model.parameters())
            log.info(
                "%s r=%d on %d module(s): %d trainable parameters of %d (%.2f%%)",
                self.cfg.method,
                self.cfg.r,
                len(self.targets),
                trainable,
                total,
                100.0 * trainable / max(total, 1),
            )
        return model

    @hookimpl
    def on_stage_end(self, stage: str, result: Any, trainer: Any) -> None:
        """After a sharded load: the LoRA parameters it left on meta get their values."""
        if stage != "parallelize_model" or not self.init_after_load:
            return
        from .sharded import init_lora_shards

        model = trainer.strategy.unwrap(result)
        init_lora_shards(model, self.config.run.seed, trainer.dist.device, self._init_from())

    def _init_from(self) -> Path | None:
        """``init_from`` relative to the config file's directory."""
        if self.cfg.init_from is None:
            return None
        path = Path(self.cfg.init_from).expanduser()
        if not path.is_absolute() and self.config.source_path:
            path = Path(self.config.source_path).parent / path
        return path

    @hookimpl
    def build_checkpointer(
        self,
        config: Any,
        dist: Any,
        model: Any,
        optimizer: Any,
        lr_scheduler: Any,
        dataloaders: Any,
    ) -> Any:
        """The core checkpointer, saving and restoring only the trainable parameters."""
        from hyper_core.checkpoint import Checkpointer

        return Checkpointer(
            config,
            dist,
            model=model,
            optimizer=optimizer,
            lr_scheduler=lr_scheduler,
            dataloaders=dataloaders,
            trainable_only=True,
        )


def _is_meta(model: Any) -> bool:
    return any(p.is_meta for p in model.parameters())
