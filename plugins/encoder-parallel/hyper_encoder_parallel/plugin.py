"""The ``hyper_train.plugins`` entry point of hyper-train-encoder-parallel (imports no torch).

* ``[encoder_parallel]`` config section; ``enabled = true`` balances the vision encoder on top
  of any ``[parallel] strategy``;
* the ``encoder_parallel`` strategy: ``[encoder_parallel] base`` (default ``fsdp2``) with
  balancing on, bound to its base after ``build_model``;
* ``build_callbacks``: a run that enables either gets its own
  :class:`~hyper_encoder_parallel.run.EncoderParallelRun`, which checks that the adapter
  declares a vision encoder, installs the balancer (:mod:`hyper_encoder_parallel.balancer`)
  after the strategy applies, and adds to ``on_log`` ``encoder_parallel/imbalance_before``/
  ``_after`` (max/mean encoder cost over ranks, averaged over the logging interval) and the
  share of micro-steps and images moved.
"""

from __future__ import annotations

from typing import Any

from hyper_core import hookimpl
from hyper_core.registry import normalize_name

from .run import SECTION, STRATEGY, EncoderParallelRun, settings_of


@hookimpl
def register_parallel_strategies(register: Any) -> None:
    """``encoder_parallel``: ``[encoder_parallel] base`` with balancing on."""
    register(STRATEGY, "hyper_encoder_parallel.strategy:EncoderParallel")


@hookimpl
def register_config_sections(register: Any) -> None:
    """``[encoder_parallel]``."""
    register(SECTION, "hyper_encoder_parallel.config:EncoderParallelConfig")


@hookimpl
def build_callbacks(config: Any) -> EncoderParallelRun | None:
    """The run's :class:`EncoderParallelRun` when ``[encoder_parallel] enabled`` or
    ``[parallel] strategy = "encoder_parallel"``; otherwise the plugin does nothing."""
    settings = settings_of(config)
    if settings.enabled:
        return EncoderParallelRun(settings, f"$.{SECTION}.enabled")
    if normalize_name(config.parallel.strategy) == normalize_name(STRATEGY):
        return EncoderParallelRun(settings, "$.parallel.strategy")
    return None
