"""The value objects and callables that flow between build stages, in one place for plugin
authors: what each hook of :mod:`hyper_core.hookspecs` receives and returns.

The callables are :class:`typing.Protocol` classes: a stage's result need not subclass them,
only have their shape.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from contextlib import AbstractContextManager
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import attrs

from .adapters.base import (
    ContextParallelAdapter,
    FlopsCount,
    ModelAdapter,
    ModelAssets,
    MoEAdapter,
    MoEBlock,
    ParallelPlan,
    TokenSplit,
    VisionEncoderAdapter,
    VisionEncoderSpec,
)
from .adapters.vision_context import VisionContext
from .batching.types import IGNORE_INDEX, MicroBatch, SampleFeatures
from .parallel.env import DistEnv
from .parallel.load_plan import LoadPlan
from .trainer.state import TrainState

if TYPE_CHECKING:
    import argparse

    import torch

    from .cli.parser import CommandParser
    from .trainer.trainer import Trainer


@attrs.define(kw_only=True)
class DatasetSplits:
    """The datasets of a run (``build_dataset``'s result)."""

    train: Any
    eval: Any = None


@attrs.define(kw_only=True)
class DataLoaders:
    """The loaders of a run (``build_dataloader``'s result)."""

    train: Any
    eval: Any = None


class Register(Protocol):
    """The ``register`` callback of the component registration hooks (``options``: dataset
    formats only, their options class or ``"module:Class"``)."""

    def __call__(
        self,
        name: str,
        ref: Any,
        *,
        aliases: Iterable[str] = (),
        overrides: str | None = None,
        options: type | str | None = None,
    ) -> None: ...


class RegisterSection(Protocol):
    """The ``register`` callback of ``register_config_sections``."""

    def __call__(self, name: str, cls: type | str) -> None: ...


class RegisterCommand(Protocol):
    """The ``register`` callback of ``register_commands``."""

    def __call__(
        self,
        name: str,
        add_arguments: Callable[[CommandParser], None],
        run: Callable[[argparse.Namespace], int | None],
        help: str = "",
        *,
        description: str | None = None,
    ) -> None: ...


class LossFn(Protocol):
    """``build_loss``'s result: this micro-batch's loss sum divided by ``num_loss_tokens``, and
    extra named values to log."""

    def __call__(
        self, outputs: Any, loss_inputs: dict[str, Any], num_loss_tokens: float
    ) -> tuple[torch.Tensor, dict[str, Any]]: ...


class Transform(Protocol):
    """``build_data_transform``'s result: one raw sample to tokens (``SampleError`` if bad)."""

    def __call__(self, sample: Mapping[str, Any]) -> SampleFeatures: ...


class Collate(Protocol):
    """``build_collate_fn``'s result: one rank's samples of one step to its micro-batches."""

    def __call__(self, features: list[SampleFeatures]) -> list[MicroBatch]: ...


class GetBatch(Protocol):
    """``build_get_batch``'s result: one micro-batch to ``(model_inputs, loss_inputs)`` on the
    device."""

    def __call__(self, micro_batch: MicroBatch) -> tuple[dict[str, Any], dict[str, Any]]: ...


#: ``build_training_context``'s result: a fresh context manager around each forward.
TrainingContext = Callable[[], AbstractContextManager[Any]]


@runtime_checkable
class Checkpointer(Protocol):
    """``build_checkpointer``'s result: saves the run and resumes it."""

    #: The directory the checkpoints go to (``step-N`` below it).
    root: Path

    def check_resume(self, trainer: Trainer) -> Path | None:
        """The checkpoint a resume would load, checked on every rank (collective)."""
        ...

    def maybe_resume(self, trainer: Trainer) -> Path | None:
        """Restore the run from a checkpoint when ``[checkpoint] resume`` asks for it."""
        ...

    def maybe_save(self, trainer: Trainer, *, final: bool = False) -> None:
        """Save when the step is due (or ``final``)."""
        ...

    def wait(self) -> None:
        """Finish a save still in flight."""
        ...


__all__ = [
    "IGNORE_INDEX",
    "Checkpointer",
    "Collate",
    "ContextParallelAdapter",
    "DataLoaders",
    "DatasetSplits",
    "DistEnv",
    "FlopsCount",
    "GetBatch",
    "LoadPlan",
    "LossFn",
    "MicroBatch",
    "MoEAdapter",
    "MoEBlock",
    "ModelAdapter",
    "ModelAssets",
    "ParallelPlan",
    "Register",
    "RegisterCommand",
    "RegisterSection",
    "SampleFeatures",
    "TokenSplit",
    "TrainState",
    "TrainingContext",
    "Transform",
    "VisionContext",
    "VisionEncoderAdapter",
    "VisionEncoderSpec",
]
