"""Hook specifications: the whole plugin API of hyper-train.

Three kinds of hook, called by the trainer in a fixed order (see ``docs/architecture.md``):

* **Registration** hooks run once per process when plugins load. Each receives a ``register``
  callback; they must be cheap and import neither torch nor transformers (register lazy
  ``"package.module:Name"`` references instead of classes).
* **Build stages** run once per run, in the order of :data:`BUILD_STAGES`. They are
  ``firstresult``: the first implementation that returns something other than ``None`` wins. The
  core's defaults are registered ``trylast``, so a plugin replaces a stage by returning a value,
  or wraps it with ``@hookimpl(wrapper=True)``. After each stage ``on_stage_end`` fires.
* **Lifecycle events** run every implementation; their return values are ignored.

All hooks are called with keyword arguments; an implementation may accept any subset of a
hook's parameters. Types named in the docstrings live in :mod:`hyper_core.types`.
"""

from __future__ import annotations

from typing import Any

import pluggy

PROJECT_NAME = "hyper_train"

hookspec = pluggy.HookspecMarker(PROJECT_NAME)
hookimpl = pluggy.HookimplMarker(PROJECT_NAME)

#: The build stages in the order the trainer runs them.
BUILD_STAGES: tuple[str, ...] = (
    "setup_distributed",
    "build_model",
    "parallelize_model",
    "build_loss",
    "build_model_assets",
    "build_data_transform",
    "build_dataset",
    "build_collate_fn",
    "build_dataloader",
    "build_get_batch",
    "compute_train_iters",
    "build_optimizer",
    "build_lr_scheduler",
    "build_training_context",
    "build_checkpointer",
    "build_callbacks",
)

#: The lifecycle events, roughly in the order they first fire.
LIFECYCLE_EVENTS: tuple[str, ...] = (
    "on_stage_end",
    "on_train_begin",
    "on_epoch_begin",
    "on_step_begin",
    "on_micro_step_end",
    "on_step_end",
    "on_log",
    "on_evaluate",
    "on_save_checkpoint",
    "on_load_checkpoint",
    "on_epoch_end",
    "on_train_end",
    "on_train_error",
)

REGISTRATION_HOOKS: tuple[str, ...] = (
    "register_model_adapters",
    "register_batching_runtimes",
    "register_parallel_strategies",
    "register_dataset_formats",
    "register_config_sections",
    "register_commands",
)


# --------------------------------------------------------------------------------------------
# Registration
# --------------------------------------------------------------------------------------------


@hookspec
def register_model_adapters(register: Any) -> None:
    """Register model adapters.

    Called once per process while plugins load. Call
    ``register(name, ref, *, aliases=(), overrides=None)`` for each adapter: ``ref`` is an
    :class:`~hyper_core.adapters.ModelAdapter` subclass or a lazy ``"module:Class"`` string;
    ``aliases`` are further names, model types or architectures it serves (all normalised, see
    :func:`hyper_core.registry.normalize_name`); ``overrides`` names an adapter of another plugin
    that this one deliberately replaces.

    Example::

        @hookimpl
        def register_model_adapters(register):
            register("llava", "my_pkg.adapter:LlavaAdapter",
                     aliases=["LlavaForConditionalGeneration"])
    """


@hookspec
def register_batching_runtimes(register: Any) -> None:
    """Register batching runtimes (``[data] batching = NAME``).

    ``register(name, ref, *, aliases=(), overrides=None)`` with ``ref`` a
    :class:`~hyper_core.batching.BatchingRuntime` subclass or ``"module:Class"``. The core
    registers ``padded`` and ``packed``.
    """


@hookspec
def register_parallel_strategies(register: Any) -> None:
    """Register parallel strategies (``[parallel] strategy = NAME``).

    ``register(name, ref, *, aliases=(), overrides=None)`` with ``ref`` a
    :class:`~hyper_core.parallel.ParallelStrategy` subclass or ``"module:Class"``. The core
    registers ``none``, ``ddp`` and ``fsdp2``.
    """


@hookspec
def register_dataset_formats(register: Any) -> None:
    """Register dataset formats (``[data] train = { format = NAME, ... }``).

    ``register(name, ref, *, aliases=(), overrides=None)`` with ``ref`` a callable or
    ``"module:function"`` taking ``(source, config)`` and returning an iterable of raw sample
    dicts (see :class:`~hyper_core.data.DatasetFormat`). The core registers ``jsonl``.
    """


@hookspec
def register_config_sections(register: Any) -> None:
    """Register top-level config sections owned by a plugin.

    ``register(name, cls)`` with ``cls`` an attrs class (or ``"module:Class"``) whose fields are the
    section's keys. The section is validated strictly like the core's and is available as
    ``config.section(name)``. Defaults are used when the section is absent.

    Example::

        @hookimpl
        def register_config_sections(register):
            register("memory_profiler", "hyper_memory_profiler.config:MemoryProfilerConfig")
    """


@hookspec
def register_commands(register: Any) -> None:
    """Register ``hyper-train`` subcommands.

    ``register(name, add_arguments, run, help="")``: ``add_arguments(parser)`` fills an argparse
    sub-parser; ``run(args) -> int | None`` executes the command and returns an exit code. Both
    must import heavy modules lazily.
    """


# --------------------------------------------------------------------------------------------
# Build stages (firstresult)
# --------------------------------------------------------------------------------------------


@hookspec(firstresult=True)
def setup_distributed(config: Any) -> Any:
    """Initialise the process group and device mesh.

    Receives the validated :class:`~hyper_core.config.Config`. Returns a
    :class:`~hyper_core.types.DistEnv` (rank, world size, device, mesh). The default reads the
    torchrun environment; without it the run is a single process.
    """


@hookspec(firstresult=True)
def build_model(config: Any, adapter: Any, dist: Any) -> Any:
    """Build the ``torch.nn.Module`` to train.

    ``adapter`` is the resolved :class:`~hyper_core.adapters.ModelAdapter`; ``dist`` the
    :class:`~hyper_core.types.DistEnv`. The default asks the adapter (random init from a named
    config, or weights from ``[model] path``) and applies ``[model] freeze``.
    """


@hookspec(firstresult=True)
def parallelize_model(config: Any, model: Any, adapter: Any, dist: Any, strategy: Any) -> Any:
    """Apply the parallel strategy and return the model to train.

    ``strategy`` is the :class:`~hyper_core.parallel.ParallelStrategy` named by
    ``[parallel] strategy``; the default calls its ``apply`` with the adapter's
    :class:`~hyper_core.adapters.ParallelPlan`, after activation checkpointing (when
    ``[training] activation_checkpointing``) of each sharding unit.
    """


@hookspec(firstresult=True)
def build_loss(config: Any, adapter: Any) -> Any:
    """Return the loss function ``loss_fn(outputs, loss_inputs, num_loss_tokens) -> (loss, dict)``.

    ``num_loss_tokens`` is the global count of loss tokens of the whole step (all ranks, all
    micro-batches): the loss is a *sum* over this micro-batch divided by it, so that gradient
    accumulation and data parallelism give the gradient of the mean over the global batch.
    """


@hookspec(firstresult=True)
def build_model_assets(config: Any, adapter: Any) -> Any:
    """Return the :class:`~hyper_core.types.ModelAssets` (tokenizer, processor) of the model."""


@hookspec(firstresult=True)
def build_data_transform(config: Any, adapter: Any, assets: Any) -> Any:
    """Return ``transform(sample: dict) -> SampleFeatures`` turning a raw sample into tokens.

    The transform raises :class:`~hyper_core.data.SampleError` for a bad sample; the dataset
    skips and counts it (or stops, with ``[data] on_error = "raise"``).
    """


@hookspec(firstresult=True)
def build_dataset(config: Any, transform: Any, dist: Any, registries: Any) -> Any:
    """Return the :class:`~hyper_core.types.DatasetSplits` (train and optional eval)."""


@hookspec(firstresult=True)
def build_collate_fn(config: Any, runtime: Any, assets: Any) -> Any:
    """Return ``collate(features: list[SampleFeatures]) -> list[MicroBatch]``.

    The list holds one rank's samples for one optimizer step; the result is that step's
    micro-batches, built by the batching ``runtime``.
    """


@hookspec(firstresult=True)
def build_dataloader(config: Any, datasets: Any, collate_fn: Any, dist: Any) -> Any:
    """Return the :class:`~hyper_core.types.DataLoaders` (train and optional eval).

    The train loader yields, per optimizer step, the list of this rank's micro-batches; it is
    sharded by rank, resumable (``state_dict``/``load_state_dict``) and reshuffled per epoch.
    """


@hookspec(firstresult=True)
def build_get_batch(config: Any, runtime: Any, dist: Any) -> Any:
    """Return ``get_batch(micro_batches) -> list[(model_inputs, loss_inputs)]`` on the device."""


@hookspec(firstresult=True)
def compute_train_iters(config: Any, dataloaders: Any, dist: Any) -> Any:
    """Return the number of optimizer steps of the run (``steps``, or ``epochs`` × steps/epoch)."""


@hookspec(firstresult=True)
def build_optimizer(config: Any, model: Any) -> Any:
    """Return the ``torch.optim.Optimizer`` (default: AdamW, no weight decay on 1-D params)."""


@hookspec(firstresult=True)
def build_lr_scheduler(config: Any, optimizer: Any, train_iters: int) -> Any:
    """Return the LR scheduler (constant, linear or cosine, with linear warmup)."""


@hookspec(firstresult=True)
def build_training_context(config: Any, model: Any, dist: Any) -> Any:
    """Return a zero-argument callable giving the context manager around each forward.

    The default enables bf16 autocast with ``[training] mixed_precision = "bf16"``.
    """


@hookspec(firstresult=True)
def build_checkpointer(
    config: Any, dist: Any, model: Any, optimizer: Any, lr_scheduler: Any, dataloaders: Any
) -> Any:
    """Return the :class:`~hyper_core.checkpoint.Checkpointer` that saves and resumes the run."""


@hookspec(firstresult=True)
def build_callbacks(config: Any, dist: Any) -> Any:
    """Return a list of objects with lifecycle hook implementations for this run.

    They are registered on the plugin manager for the duration of the run (the core's progress
    bar and metrics writer are such callbacks). Implementations must extend, not replace, the
    list: use a wrapper (``@hookimpl(wrapper=True)``) and append to the result.
    """


# --------------------------------------------------------------------------------------------
# Lifecycle events (all implementations run)
# --------------------------------------------------------------------------------------------


@hookspec
def on_stage_end(stage: str, result: Any, trainer: Any) -> None:
    """A build stage finished. ``stage`` is its hook name, ``result`` what it returned.

    ``trainer`` is the :class:`~hyper_core.trainer.Trainer`; the objects built so far are its
    attributes (``trainer.model``, ``trainer.optimizer``, ...).
    """


@hookspec
def on_train_begin(trainer: Any, state: Any) -> None:
    """All stages built and a checkpoint (if any) restored; the first step is about to run.

    ``state`` is the :class:`~hyper_core.types.TrainState` (``global_step``, ``epoch``, ...).
    """


@hookspec
def on_epoch_begin(trainer: Any, state: Any, epoch: int) -> None:
    """An epoch of the train loader starts (also fires for a resumed, partial epoch)."""


@hookspec
def on_step_begin(trainer: Any, state: Any, micro_batches: list[Any]) -> None:
    """All micro-batches of a step are fetched; forward/backward is about to start.

    ``micro_batches`` are the :class:`~hyper_core.types.MicroBatch` objects (still on the host).
    """


@hookspec
def on_micro_step_end(trainer: Any, state: Any, micro_step: int, loss: Any) -> None:
    """One micro-batch's forward and backward finished. ``loss`` is its (scaled) loss tensor."""


@hookspec
def on_step_end(
    trainer: Any, state: Any, loss: float, loss_dict: dict[str, float], grad_norm: float | None
) -> None:
    """An optimizer step finished and ``state.global_step`` was incremented.

    ``loss`` is the global loss of the step (all ranks), ``grad_norm`` the norm before clipping.
    """


@hookspec
def on_log(trainer: Any, state: Any, metrics: dict[str, Any]) -> None:
    """Metrics of a logged step (every ``[logging] every_steps``). Runs on every rank.

    Implementations may add keys to ``metrics`` (they are written to ``metrics.jsonl`` after this
    hook returns, on rank 0).
    """


@hookspec
def on_evaluate(trainer: Any, state: Any, metrics: dict[str, Any]) -> None:
    """An evaluation finished; ``metrics`` holds ``eval_loss`` and whatever plugins added."""


@hookspec
def on_save_checkpoint(trainer: Any, state: Any, plugin_state: dict[str, Any]) -> None:
    """A checkpoint is being written. Add picklable-free JSON-able state under a plugin's key.

    ``plugin_state`` is saved with the checkpoint and given back to ``on_load_checkpoint``.
    """


@hookspec
def on_load_checkpoint(trainer: Any, state: Any, plugin_state: dict[str, Any]) -> None:
    """A checkpoint was restored; ``plugin_state`` is what ``on_save_checkpoint`` stored."""


@hookspec
def on_epoch_end(trainer: Any, state: Any, epoch: int) -> None:
    """The train loader is exhausted for ``epoch``."""


@hookspec
def on_train_end(trainer: Any, state: Any) -> None:
    """The run finished normally (also after a clean stop on SIGTERM/Ctrl-C)."""


@hookspec
def on_train_error(trainer: Any, state: Any, exc: BaseException) -> None:
    """The run failed with ``exc``. The original exception propagates after this hook.

    An exception raised by an implementation is logged, never raised over ``exc``.
    """
