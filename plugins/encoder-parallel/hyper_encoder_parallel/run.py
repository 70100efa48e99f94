"""One run's encoder parallelism: the per-run object the plugin's ``build_callbacks`` returns.

It binds the ``encoder_parallel`` strategy to its base (``on_stage_end`` of ``build_model``),
checks the adapter and installs the balancer around ``parallelize_model``, holds that balancer
for the run, shows it the host side of every micro-batch through ``build_get_batch``, and adds
its metrics to ``on_log``. It imports no torch: the balancer
(:mod:`hyper_encoder_parallel.balancer`) is imported when a run with several ranks installs it.
"""

from __future__ import annotations

import logging
from collections.abc import Generator
from typing import TYPE_CHECKING, Any

from hyper_core import hookimpl
from hyper_core.errors import ConfigError

from .config import EncoderParallelConfig

if TYPE_CHECKING:
    from .balancer import EncoderBalancer

log = logging.getLogger("hyper_train.encoder_parallel")

SECTION = "encoder_parallel"
STRATEGY = "encoder_parallel"


def settings_of(config: Any) -> EncoderParallelConfig:
    """The run's ``[encoder_parallel]`` section (defaults when absent)."""
    section = config.section(SECTION)
    return section if section is not None else EncoderParallelConfig()


def is_ours(strategy: Any) -> bool:
    """Whether ``strategy`` is the ``encoder_parallel`` strategy."""
    from .strategy import EncoderParallel

    return isinstance(strategy, EncoderParallel)


def check_vision_encoder(adapter: Any, plan: Any, path: str) -> None:
    """A :class:`ConfigError` at ``path`` unless ``adapter`` declares and can call its encoder."""
    from hyper_core.adapters.base import VisionEncoderAdapter

    missing = [
        name
        for name in ("split_vision_inputs", "call_vision_encoder", "inject_vision_outputs")
        if not isinstance(adapter, VisionEncoderAdapter)
        and not callable(getattr(adapter, name, None))
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


class EncoderParallelRun:
    """Encoder parallelism for one run (``[encoder_parallel] enabled`` or the strategy)."""

    #: The balancer makes every rank call the vision encoder in every micro-step (also a rank
    #: that owns no image), so the run needs no vision filler (see ``build_callbacks``).
    runs_vision_encoder_on_every_rank = True

    def __init__(self, settings: EncoderParallelConfig, path: str) -> None:
        self.settings = settings
        #: The config key that turned it on, for errors.
        self.path = path
        #: Set by ``parallelize_model`` when several ranks train.
        self.balancer: EncoderBalancer | None = None

    @hookimpl
    def on_stage_end(self, stage: str, trainer: Any) -> None:
        """After ``build_model``: bind the ``encoder_parallel`` strategy to its base."""
        if stage == "build_model" and is_ours(trainer.strategy):
            self._bind(trainer)

    def _bind(self, trainer: Any) -> None:
        from hyper_core.registry import normalize_name
        from hyper_core.resolve import named

        config = trainer.config
        base_name = self.settings.base
        if normalize_name(base_name) == normalize_name(STRATEGY):
            raise ConfigError(
                [(f"$.{SECTION}.base", "must name the strategy underneath (ddp, fsdp2, ...)")]
            )
        cls = named(f"$.{SECTION}.base", trainer.registries.parallel_strategies, base_name)
        base = cls(config.parallel, config.training)
        if trainer.load_plan.meta_init and not base.meta_init:
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

    @hookimpl(wrapper=True)
    def parallelize_model(
        self, model: Any, adapter: Any, dist: Any, strategy: Any
    ) -> Generator[None, Any, Any]:
        """Apply the strategy, then hook the model's forward to balance its vision encoder."""
        plan = adapter.parallel_plan(model)
        check_vision_encoder(adapter, plan, self.path)
        if getattr(dist, "cp", 1) > 1:
            raise ConfigError(
                [
                    (
                        self.path,
                        f"does not combine with [parallel] cp = {dist.cp}, which shares out "
                        "the vision encoder over each cp group's ranks itself",
                    )
                ]
            )
        result = yield
        if dist.world_size == 1:
            log.info("encoder_parallel: one rank, nothing to balance (no-op)")
            return result
        from .balancer import install

        spec = plan.vision_encoder
        self.balancer = install(
            result,
            strategy,
            adapter,
            spec.input_keys,
            self.settings,
            dist,
            spec.video_keys,
            spec.meta_keys,
        )
        if dist.is_main:
            log.info(
                "encoder_parallel: balancing %s over %d ranks (cost model %s)",
                plan.vision_encoder.module,
                dist.world_size,
                self.settings.cost_model,
            )
        return result

    @hookimpl(wrapper=True)
    def build_get_batch(self) -> Generator[None, Any, Any]:
        """The run's ``get_batch``, keeping each micro-batch's host inputs for the balancer (it
        reads the images' sizes and metadata there, so a step never waits for the device)."""
        get_batch = yield
        if self.balancer is None or get_batch is None:
            return get_batch
        return self.balancer.wrap_get_batch(get_batch)

    @hookimpl
    def on_log(self, state: Any, metrics: dict[str, Any]) -> None:
        """Add the interval's ``encoder_parallel/*`` metrics."""
        if self.balancer is not None:
            metrics.update(self.balancer.flush_metrics(state.global_step))
