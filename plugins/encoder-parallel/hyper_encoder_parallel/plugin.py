"""The ``hyper_train.plugins`` entry point of hyper-train-encoder-parallel (imports no torch).

* ``[encoder_parallel]`` config section; ``enabled = true`` balances the vision encoder on top
  of any ``[parallel] strategy``;
* the ``encoder_parallel`` strategy: ``[encoder_parallel] base`` (default ``fsdp2``) with
  balancing on, bound to its base after ``build_model``;
* a ``parallelize_model`` wrapper that checks the adapter declares a vision encoder, lets the
  strategy apply, then hooks the model (:mod:`hyper_encoder_parallel.balancer`);
* ``on_log``: ``encoder_parallel/imbalance_before``/``_after`` (max/mean encoder cost over
  ranks, averaged over the logging interval) and the share of micro-steps and images moved.
"""

from __future__ import annotations

import logging
from collections.abc import Generator
from typing import Any

from hyper_core import hookimpl
from hyper_core.errors import ConfigError

from .config import EncoderParallelConfig

log = logging.getLogger("hyper_train.encoder_parallel")

SECTION = "encoder_parallel"
STRATEGY = "encoder_parallel"
#: The attribute of the (unwrapped) model that holds its balancer.
ATTR = "_hyper_encoder_parallel"


@hookimpl
def register_parallel_strategies(register: Any) -> None:
    """``encoder_parallel``: ``[encoder_parallel] base`` with balancing on."""
    register(STRATEGY, "hyper_encoder_parallel.strategy:EncoderParallel")


@hookimpl
def register_config_sections(register: Any) -> None:
    """``[encoder_parallel]``."""
    register(SECTION, "hyper_encoder_parallel.config:EncoderParallelConfig")


def settings_of(config: Any) -> EncoderParallelConfig:
    """The run's ``[encoder_parallel]`` section (defaults when absent)."""
    section = config.section(SECTION)
    return section if section is not None else EncoderParallelConfig()


def _is_ours(strategy: Any) -> bool:
    from .strategy import EncoderParallel

    return isinstance(strategy, EncoderParallel)


@hookimpl
def on_stage_end(stage: str, result: Any, trainer: Any) -> None:
    """After ``build_model``: bind the ``encoder_parallel`` strategy to its base. After
    ``build_collate_fn``: drop the core's vision filler, since the balancer itself makes every
    rank run the encoder (also a rank that owns no image)."""
    if stage == "build_collate_fn":
        settings = settings_of(trainer.config)
        if (settings.enabled or _is_ours(trainer.strategy)) and trainer.dist.world_size > 1:
            trainer.runtime.vision_filler = None
        return
    if stage != "build_model" or not _is_ours(trainer.strategy):
        return
    from hyper_core.builtin.resolve import named
    from hyper_core.registry import normalize_name

    config = trainer.config
    base_name = settings_of(config).base
    if normalize_name(base_name) == normalize_name(STRATEGY):
        raise ConfigError(
            [(f"$.{SECTION}.base", "must name the strategy underneath (ddp, fsdp2, ...)")]
        )
    cls = named(f"$.{SECTION}.base", trainer.registries.parallel_strategies, base_name)
    base = cls(config.parallel, config.training)
    if trainer.dist.meta_init and not getattr(base, "meta_init", False):
        raise ConfigError(
            [
                (
                    f"$.{SECTION}.base",
                    f"{base_name!r} does not build from rank 0's weights (meta init); use "
                    f'[parallel] strategy = "{base_name}" with [{SECTION}] enabled = true',
                )
            ]
        )
    trainer.strategy.bind(base)


def check_vision_encoder(adapter: Any, plan: Any, path: str) -> None:
    """A :class:`ConfigError` at ``path`` unless ``adapter`` declares and can call its encoder."""
    from hyper_core.adapters.base import ModelAdapter

    cls = type(adapter)
    missing = [
        name
        for name in ("split_vision_inputs", "call_vision_encoder")
        if getattr(cls, name) is getattr(ModelAdapter, name)
    ]
    if plan.vision_encoder is None:
        reason = "declares no vision encoder (its ParallelPlan has no vision_encoder)"
    elif missing:
        reason = f"declares a vision encoder but does not implement {' and '.join(missing)}"
    else:
        return
    raise ConfigError(
        [
            (
                path,
                f"encoder parallelism needs a vision-language model, but adapter "
                f"{adapter.name!r} {reason}",
            )
        ]
    )


@hookimpl(wrapper=True)
def parallelize_model(
    config: Any, model: Any, adapter: Any, dist: Any, strategy: Any
) -> Generator[None, Any, Any]:
    """Apply the strategy, then hook the model's forward to balance its vision encoder."""
    settings = settings_of(config)
    via_strategy = _is_ours(strategy)
    if not (settings.enabled or via_strategy):
        return (yield)
    path = f"$.{SECTION}.enabled" if settings.enabled else "$.parallel.strategy"
    plan = adapter.parallel_plan(model)
    check_vision_encoder(adapter, plan, path)
    result = yield
    if dist.world_size == 1:
        log.info("encoder_parallel: one rank, nothing to balance (no-op)")
        return result
    from .balancer import install

    install(result, strategy, adapter, plan.vision_encoder.input_keys, settings, dist)
    if dist.is_main:
        log.info(
            "encoder_parallel: balancing %s over %d ranks (cost model %s)",
            plan.vision_encoder.module,
            dist.world_size,
            settings.cost_model,
        )
    return result


@hookimpl
def on_log(trainer: Any, state: Any, metrics: dict[str, Any]) -> None:
    """Add the interval's ``encoder_parallel/*`` metrics."""
    balancer = getattr(trainer.unwrapped_model, ATTR, None)
    if balancer is not None:
        metrics.update(balancer.flush_metrics(state.global_step))
