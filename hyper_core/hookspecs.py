"""Hook specifications: the whole plugin API of hyper-train.

Four kinds of hook; the trainer calls the first three in a fixed order (see
``docs/architecture.md``):

* **Registration** hooks run once per process when plugins load. Each receives a ``register``
  callback; they must be cheap and import neither torch nor transformers (register lazy
  ``"package.module:Name"`` references instead of classes).
* **Build stages** run once per run, in the order of :data:`BUILD_STAGES`. They are
  ``firstresult``: the first implementation that returns something other than ``None`` wins. The
  core's defaults are registered ``trylast``, so a plugin replaces a stage by returning a value,
  or wraps it with ``@hookimpl(wrapper=True)``. After each stage ``on_stage_end`` fires. The
  exception is ``build_callbacks``, which collects every plugin's per-run object: a plugin
  keeps the state of one run on that object, which receives the rest of the run's hooks.
* **Lifecycle events** run every implementation; their return values are ignored.
* **Command hooks** are called by a ``hyper-train`` subcommand outside a run (``firstresult``,
  the core's behaviour when every implementation returns ``None``).

All hooks are called with keyword arguments; an implementation may accept any subset of a
hook's parameters. The types of the parameters and results (value objects and
:class:`typing.Protocol` classes) live in :mod:`hyper_core.types`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pluggy

if TYPE_CHECKING:
    from pathlib import Path

    import torch

    from .adapters.base import ModelAdapter
    from .batching.base import BatchingRuntime
    from .config import Config
    from .export import ExportOptions
    from .parallel.base import ParallelStrategy
    from .parallel.load_plan import LoadPlan
    from .registry import Registries
    from .step.lockstep import Lockstep
    from .trainer.evaluate import Evaluator
    from .trainer.trainer import Trainer
    from .types import (
        Checkpointer,
        Collate,
        DataLoaders,
        DatasetSplits,
        DistEnv,
        GetBatch,
        LossFn,
        MicroBatch,
        ModelAssets,
        Register,
        RegisterCommand,
        RegisterSection,
        TrainingContext,
        TrainState,
        Transform,
    )

PROJECT_NAME = "hyper_train"

hookspec = pluggy.HookspecMarker(PROJECT_NAME)
hookimpl = pluggy.HookimplMarker(PROJECT_NAME)

#: The build stages in the order the trainer runs them.
BUILD_STAGES: tuple[str, ...] = (
    "setup_distributed",
    "build_callbacks",
    "plan_load",
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
    "build_evaluator",
    "build_checkpointer",
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

#: Hooks a ``hyper-train`` subcommand calls (outside a run).
COMMAND_HOOKS: tuple[str, ...] = ("export_checkpoint", "load_checkpoint_model")


# --------------------------------------------------------------------------------------------
# Registration
# --------------------------------------------------------------------------------------------


@hookspec
def register_model_adapters(register: Register) -> None:
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
def register_batching_runtimes(register: Register) -> None:
    """Register batching runtimes (``[data] batching = NAME``).

    ``register(name, ref, *, aliases=(), overrides=None)`` with ``ref`` a
    :class:`~hyper_core.batching.BatchingRuntime` subclass or ``"module:Class"``. The core
    registers ``padded`` and ``packed``.

    Example::

        @hookimpl
        def register_batching_runtimes(register):
            register("sorted_padded", "my_pkg.batching:SortedPaddedRuntime")
    """


@hookspec
def register_parallel_strategies(register: Register) -> None:
    """Register parallel strategies (``[parallel] strategy = NAME``).

    ``register(name, ref, *, aliases=(), overrides=None)`` with ``ref`` a
    :class:`~hyper_core.parallel.ParallelStrategy` subclass or ``"module:Class"``. The core
    registers ``none``, ``ddp`` and ``fsdp2``.

    Example::

        @hookimpl
        def register_parallel_strategies(register):
            register("encoder_parallel", "hyper_encoder_parallel.strategy:EncoderParallel")
    """


@hookspec
def register_dataset_formats(register: Register) -> None:
    """Register dataset formats (``[data] train = { format = NAME, ... }``).

    ``register(name, ref, *, aliases=(), overrides=None, options=None)`` with ``ref`` a callable
    or ``"module:function"`` called as ``fn(path, options, base_dir)``: ``path`` the source's
    ``path`` (or the plain string of ``[data] train``), ``options`` its other keys (without
    ``format`` and ``image_dir``), ``base_dir`` the config file's directory. It returns a list
    of fresh raw sample dicts (see :class:`~hyper_core.data.DatasetFormat`). The core
    registers ``jsonl``, ``parquet`` and ``hf`` conversations (``hyper_core.builtin.formats``)
    and the demo sets ``shapes`` and ``moving_shapes`` (``hyper_core.demo.plugin``).

    ``options=`` declares the format's options as an attrs class (or ``"module:Class"``, as the
    core's :class:`~hyper_core.data.jsonl.JsonlOptions` and
    :class:`~hyper_core.demo.shapes.ShapesOptions`): they are then validated with the rest of
    the config (``hyper-train config validate`` names ``$.data.train.KEY``, unknown keys
    included) and ``options`` is an instance of the class. Without it, ``options`` is the dict,
    checked only when the run reads the data.

    Example::

        @hookimpl
        def register_dataset_formats(register):
            # fn(path, options: ParquetChatOptions, base_dir) -> list of raw sample dicts
            register(
                "parquet_chat",
                "my_pkg.formats:load_parquet_chat",
                options="my_pkg.formats:ParquetChatOptions",
            )
    """


@hookspec
def register_config_sections(register: RegisterSection) -> None:
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
def register_commands(register: RegisterCommand) -> None:
    """Register ``hyper-train`` subcommands; the core's own (``run``, ``config``, ...) are
    registered here too, by the builtin plugin ``hyper_core.cli.plugin``.

    ``register(name, add_arguments, run, help="", *, description=None)``:
    ``add_arguments(parser)`` fills the command's parser, a
    :class:`~hyper_core.cli.parser.CommandParser` (argparse's, with the global flags
    ``--debug``, ``--strict-plugins`` and ``--plugin``; the parsers of its actions from
    ``parser.add_subparsers()`` have them too). ``parser.accept_overrides()`` lets extra
    ``--section.key=value`` arguments through as ``args.overrides`` (else they are an error).
    ``run(args) -> int | None`` executes the command and returns an exit code. Both must import
    heavy modules lazily: ``hyper-train --help`` calls every ``add_arguments``. A command that
    reads a config uses the core's helpers: ``hyper_core.cli.host.load_run_config(args)``
    (``args.config``, ``args.overrides``, the world size of
    ``hyper_core.cli.parser.add_world_options``) returns ``(config, host)``, and
    ``plugin_host(args)`` the plugin host of ``--plugin``/``--strict-plugins``. Two plugins
    registering one name is an error naming both.

    Example::

        @hookimpl
        def register_commands(register):
            def add_arguments(parser):
                parser.add_argument("output_dir")
            def run(args):
                print(args.output_dir)
                return 0
            register("where", add_arguments, run, help="print a run directory")
    """


# --------------------------------------------------------------------------------------------
# Build stages (firstresult)
# --------------------------------------------------------------------------------------------


@hookspec(firstresult=True)
def setup_distributed(config: Config) -> DistEnv | None:
    """Initialise the process group and device mesh.

    Receives the validated :class:`~hyper_core.config.Config`. Returns a
    :class:`~hyper_core.types.DistEnv` (rank, world size, device, mesh). The default reads the
    torchrun environment; without it the run is a single process.

    Example::

        @hookimpl(wrapper=True)
        def setup_distributed(config):
            dist = yield
            print(f"rank {dist.rank} of {dist.world_size} on {dist.device}")
            return dist
    """


@hookspec(firstresult=True)
def plan_load(
    config: Config, adapter: ModelAdapter, dist: DistEnv, strategy: ParallelStrategy
) -> LoadPlan | None:
    """Decide how the weights reach each rank: a frozen
    :class:`~hyper_core.types.LoadPlan`, given to ``build_model`` and ``parallelize_model``
    (and, in :attr:`ParallelPlan.load <hyper_core.adapters.ParallelPlan.load>`, to the
    strategy).

    The default (:meth:`LoadPlan.for_run <hyper_core.types.LoadPlan.for_run>`): with several
    ranks and a strategy that materialises (``meta_init``), rank 0 builds the model and the
    others build on meta; when the strategy also ``loads_shards`` and the weights come from
    ``[model] path``, every rank builds on meta and reads its own shards. A plugin changes the
    plan by wrapping this stage and returning ``attrs.evolve(plan, ...)``; one whose modules
    differ from the checkpoint's sets ``checkpoint_view`` for the sharded load.

    Example::

        @hookimpl(wrapper=True)
        def plan_load(config):
            plan = yield
            if plan.sharded_load and config.section("my_plugin").enabled:
                # my_plugin changes the weights as they load: rank 0 loads and broadcasts
                plan = attrs.evolve(plan, sharded_load=False)
            print(f"meta init: {plan.meta_init}, sharded load: {plan.sharded_load}")
            return plan
    """


@hookspec(firstresult=True)
def build_model(
    config: Config, adapter: ModelAdapter, dist: DistEnv, load: LoadPlan
) -> torch.nn.Module | None:
    """Build the ``torch.nn.Module`` to train.

    ``adapter`` is the resolved :class:`~hyper_core.adapters.ModelAdapter`; ``dist`` the
    :class:`~hyper_core.types.DistEnv`; ``load`` the run's :class:`~hyper_core.types.LoadPlan`
    (``load.build_device(dist.rank)``: ``"cpu"`` or ``"meta"``). The default asks the adapter
    (random init from a named config, or weights from ``[model] path``) and applies
    ``[model] freeze``.

    Example::

        @hookimpl(wrapper=True)
        def build_model(config, adapter, dist):
            model = yield
            model.get_input_embeddings().requires_grad_(False)  # freeze embeddings
            return model
    """


@hookspec(firstresult=True)
def parallelize_model(
    config: Config,
    model: torch.nn.Module,
    adapter: ModelAdapter,
    dist: DistEnv,
    strategy: ParallelStrategy,
    load: LoadPlan,
) -> torch.nn.Module | None:
    """Apply the parallel strategy and return the model to train.

    ``strategy`` is the :class:`~hyper_core.parallel.ParallelStrategy` named by
    ``[parallel] strategy``; the default calls its ``apply`` with the adapter's
    :class:`~hyper_core.adapters.ParallelPlan` (``load`` in its ``load``), after activation
    checkpointing of the sharding units by the ``[training] activation_checkpointing``
    policies; with ``load.sharded_load`` it then reads each rank's shards of ``[model] path``
    (inside ``load.checkpoint_view``) and calls ``strategy.weights_loaded(model)``.

    Example::

        @hookimpl
        def parallelize_model(config, model, adapter, dist, strategy):
            if config.parallel.strategy == "my_tp":
                return apply_my_tensor_parallel(model, dist.mesh)
            return None  # let the next implementation (the core) do it
    """


@hookspec(firstresult=True)
def build_loss(config: Config, adapter: ModelAdapter) -> LossFn | None:
    """Return the loss function ``loss_fn(outputs, loss_inputs, num_loss_tokens) -> (loss, dict)``.

    ``num_loss_tokens`` is the global count of loss tokens of the whole step (all ranks, all
    micro-batches): the loss is a *sum* over this micro-batch divided by it, so that gradient
    accumulation and data parallelism give the gradient of the mean over the global batch.

    When the adapter sets ``logits_at_labels_only`` (every transformers-based adapter does),
    the model computes logits only at the label positions: ``outputs.logits`` is
    ``(n, vocab)`` and ``loss_inputs["labels"]`` the ``n`` matching labels, with
    ``loss_inputs["label_mask"]`` the ``(batch, seq)`` positions they come from. A loss that
    flattens logits and labels (the default, the example) works on both layouts. The last
    decoder layer's per-token modules then run at those positions only (the adapter's
    ``label_row_modules``), so the final hidden states of the other positions are not
    meaningful: a loss that needs them sets ``logits_at_labels_only = False`` on its adapter.

    Example::

        @hookimpl
        def build_loss(config, adapter):
            def loss_fn(outputs, loss_inputs, num_loss_tokens):
                labels = loss_inputs["labels"]
                nll = torch.nn.functional.cross_entropy(
                    outputs.logits.flatten(0, -2).float(), labels.flatten(), reduction="sum")
                return nll / num_loss_tokens, {}
            return loss_fn
    """


@hookspec(firstresult=True)
def build_model_assets(config: Config, adapter: ModelAdapter) -> ModelAssets | None:
    """Return the :class:`~hyper_core.types.ModelAssets` (tokenizer, processor) of the model.

    Example::

        @hookimpl(wrapper=True)
        def build_model_assets(config, adapter):
            assets = yield
            assets.tokenizer.padding_side = "left"
            return assets
    """


@hookspec(firstresult=True)
def build_data_transform(
    config: Config, adapter: ModelAdapter, assets: ModelAssets
) -> Transform | None:
    """Return ``transform(sample: dict) -> SampleFeatures`` turning a raw sample into tokens.

    The transform raises :class:`~hyper_core.data.SampleError` for a bad sample; the dataset
    skips and counts it (or stops, with ``[data] on_error = "raise"``).

    Example::

        @hookimpl(wrapper=True)
        def build_data_transform(config, adapter, assets):
            transform = yield
            def without_system_turns(sample):
                messages = [m for m in sample["messages"] if m["role"] != "system"]
                return transform({**sample, "messages": messages})
            return without_system_turns
    """


@hookspec(firstresult=True)
def build_dataset(
    config: Config, transform: Transform, dist: DistEnv, registries: Registries
) -> DatasetSplits | None:
    """Return the :class:`~hyper_core.types.DatasetSplits` (train and optional eval).

    Example::

        @hookimpl(wrapper=True)
        def build_dataset(config, transform, dist, registries):
            splits = yield
            print(f"{len(splits.train)} training samples")
            return splits
    """


@hookspec(firstresult=True)
def build_collate_fn(
    config: Config, runtime: BatchingRuntime, assets: ModelAssets
) -> Collate | None:
    """Return ``collate(features: list[SampleFeatures]) -> list[MicroBatch]``.

    The list holds one rank's samples for one optimizer step; the result is that step's
    micro-batches, built by the batching ``runtime``. The default honours ``[data]
    max_tokens_per_micro_batch`` (:class:`~hyper_core.batching.token_budget.TokenBudgetCollate`);
    a replacement that ignores it gets fixed-size micro-batches.

    Example::

        @hookimpl(wrapper=True)
        def build_collate_fn(config, runtime, assets):
            collate = yield
            return lambda features: collate(sorted(features, key=lambda f: f.length))
    """


@hookspec(firstresult=True)
def build_dataloader(
    config: Config, datasets: DatasetSplits, collate_fn: Collate, dist: DistEnv
) -> DataLoaders | None:
    """Return the :class:`~hyper_core.types.DataLoaders` (train and optional eval).

    The train loader yields, per optimizer step, the list of this rank's micro-batches; it is
    sharded by rank, resumable (``state_dict``/``load_state_dict``) and reshuffled per epoch.
    ``dist`` is the data-parallel view (``DistEnv.data_view()``): with ``[parallel] cp`` the
    ranks of a cp group share one data shard, so shard by its ``rank``/``world_size`` and do
    no collectives with it.

    Example::

        @hookimpl(wrapper=True)
        def build_dataloader(config, datasets, collate_fn, dist):
            loaders = yield
            print(f"{loaders.train.steps_per_epoch} steps per epoch")
            return loaders
    """


@hookspec(firstresult=True)
def build_get_batch(config: Config, runtime: BatchingRuntime, dist: DistEnv) -> GetBatch | None:
    """Return ``get_batch(micro_batch) -> (model_inputs, loss_inputs)``.

    It is called once per micro-batch (a :class:`~hyper_core.types.MicroBatch`, still on the
    host) and returns the two dicts of tensors on ``dist.device``: ``model_inputs`` go to the
    model's forward, ``loss_inputs`` (``labels``) to the loss. The default is the runtime's
    ``to_device``.

    Example::

        @hookimpl(wrapper=True)
        def build_get_batch(config, runtime, dist):
            get_batch = yield
            def get_batch_bf16(micro_batch):
                model_inputs, loss_inputs = get_batch(micro_batch)
                if "pixel_values" in model_inputs:
                    model_inputs["pixel_values"] = model_inputs["pixel_values"].bfloat16()
                return model_inputs, loss_inputs
            return get_batch_bf16
    """


@hookspec(firstresult=True)
def compute_train_iters(config: Config, dataloaders: DataLoaders, dist: DistEnv) -> int | None:
    """Return the number of optimizer steps of the run (``steps``, or ``epochs`` × steps/epoch).

    Example::

        @hookimpl
        def compute_train_iters(config, dataloaders, dist):
            return min(config.training.steps or 10**9, 2 * dataloaders.train.steps_per_epoch)
    """


@hookspec(firstresult=True)
def build_optimizer(config: Config, model: torch.nn.Module) -> torch.optim.Optimizer | None:
    """Return the ``torch.optim.Optimizer`` (default: AdamW, no weight decay on 1-D params).

    Example::

        @hookimpl
        def build_optimizer(config, model):
            return torch.optim.SGD(model.parameters(), lr=config.training.lr, momentum=0.9)
    """


@hookspec(firstresult=True)
def build_lr_scheduler(
    config: Config, optimizer: torch.optim.Optimizer, train_iters: int
) -> torch.optim.lr_scheduler.LRScheduler | None:
    """Return the LR scheduler (constant, linear or cosine, with linear warmup).

    Example::

        @hookimpl
        def build_lr_scheduler(config, optimizer, train_iters):
            return torch.optim.lr_scheduler.StepLR(optimizer, step_size=max(1, train_iters // 3))
    """


@hookspec(firstresult=True)
def build_training_context(
    config: Config, model: torch.nn.Module, dist: DistEnv
) -> TrainingContext | None:
    """Return a zero-argument callable giving the context manager around each forward.

    The default enables bf16 autocast with ``[training] mixed_precision = "bf16"``.

    Example::

        @hookimpl
        def build_training_context(config, model, dist):
            return lambda: torch.autocast(dist.device.type, dtype=torch.float16)
    """


@hookspec(firstresult=True)
def build_evaluator(
    config: Config,
    dist: DistEnv,
    adapter: ModelAdapter,
    strategy: ParallelStrategy,
    model: torch.nn.Module,
    loss_fn: LossFn,
    assets: ModelAssets,
    dataloaders: DataLoaders,
    get_batch: GetBatch,
    training_context: TrainingContext,
    lockstep: Lockstep[MicroBatch],
) -> Evaluator | None:
    """Return the :class:`~hyper_core.trainer.evaluate.Evaluator` the run evaluates with.

    Its ``evaluate()`` returns the metrics dict logged under ``eval`` (a collective: every rank
    calls it). The default, :class:`~hyper_core.trainer.evaluate.DefaultEvaluator`, computes
    ``eval_loss`` with ``loss_fn`` (the same normalisation as training), ``perplexity``,
    ``token_accuracy``, exact match per question type and ``eval_generate_samples``; it runs
    its forwards through ``lockstep`` (:class:`~hyper_core.step.lockstep.Lockstep`) so that
    every rank runs as many as the others. A ``samples`` entry is written to
    ``eval_samples.jsonl``. ``get_batch`` is the run's, with the label positions marked first
    when the model computes logits only there (as in training; see ``build_loss``).

    Example::

        @hookimpl(wrapper=True)
        def build_evaluator(config, dist):
            evaluator = yield
            class WithBestLoss:
                best = float("inf")
                def evaluate(self):
                    metrics = evaluator.evaluate()
                    self.best = min(self.best, metrics["eval_loss"])
                    metrics["best_eval_loss"] = self.best
                    return metrics
            return WithBestLoss()
    """


@hookspec(firstresult=True)
def build_checkpointer(
    config: Config,
    dist: DistEnv,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    lr_scheduler: torch.optim.lr_scheduler.LRScheduler,
    dataloaders: DataLoaders,
) -> Checkpointer | None:
    """Return the :class:`~hyper_core.types.Checkpointer` that saves and resumes the run.

    The default is :class:`hyper_core.checkpoint.Checkpointer` (DCP checkpoints under
    ``output_dir/checkpoints``).

    Example::

        @hookimpl(wrapper=True)
        def build_checkpointer(config, dist, model, optimizer,
                               lr_scheduler, dataloaders):
            checkpointer = yield
            print(f"checkpoints go to {checkpointer.root}")
            return checkpointer
    """


@hookspec
def build_callbacks(
    config: Config, dist: DistEnv, adapter: ModelAdapter
) -> object | list[object] | None:
    """Return this plugin's per-run object (or ``None``; a list of objects is also accepted).

    The one *collecting* build stage: every implementation runs, right after
    ``setup_distributed``, and each object returned is registered on the plugin manager for this
    run only (unregistered when the run ends, also after an error), so that a plugin's per-run
    state lives on an object the run owns, never at module level or on the model. The object's
    ``@hookimpl`` methods receive the rest of the run: ``on_stage_end`` of every later stage
    (``build_callbacks`` first), the build stages themselves (e.g. a ``parallelize_model``
    wrapper) and all lifecycle events. ``adapter`` is the run's
    :class:`~hyper_core.adapters.ModelAdapter`; the model is not built yet. The core's
    plugins return the progress display on rank 0 (``hyper_core.builtin.progress``), the MoE
    routing statistics with ``[parallel] ep > 1`` (``hyper_core.builtin.moe_stats``) and the
    step profiler with ``[logging] profile_steps`` (``hyper_core.builtin.step_profiler``).

    An object with ``runs_vision_encoder_on_every_rank = True`` makes every rank call the
    vision encoder in every micro-step itself, so batching adds no vision filler to image-less
    micro-batches (see :class:`~hyper_core.batching.BatchingOptions`).

    Example::

        class MyRun:
            def __init__(self, config):
                self.steps = 0

            @hookimpl
            def on_step_end(self, state):
                self.steps += 1

        @hookimpl
        def build_callbacks(config, dist, adapter):
            return MyRun(config) if config.section("my_plugin").enabled else None
    """


# --------------------------------------------------------------------------------------------
# Lifecycle events (all implementations run)
# --------------------------------------------------------------------------------------------


@hookspec
def on_stage_end(stage: str, result: Any, trainer: Trainer) -> None:
    """A build stage finished. ``stage`` is its hook name, ``result`` what it returned.

    ``trainer`` is the :class:`~hyper_core.trainer.trainer.Trainer`; the objects built so far
    are its attributes (``trainer.model``, ``trainer.optimizer``, ...).

    Example::

        @hookimpl
        def on_stage_end(stage, result, trainer):
            if stage == "build_model":
                print(sum(p.numel() for p in result.parameters()), "parameters")
    """


@hookspec
def on_train_begin(trainer: Trainer, state: TrainState) -> None:
    """All stages built and a checkpoint (if any) restored; the first step is about to run.

    ``state`` is the :class:`~hyper_core.types.TrainState` (``global_step``, ``epoch``, ...).

    Example::

        @hookimpl
        def on_train_begin(trainer, state):
            print(f"training {trainer.train_iters} steps from step {state.global_step}")
    """


@hookspec
def on_epoch_begin(trainer: Trainer, state: TrainState, epoch: int) -> None:
    """An epoch of the train loader starts (also fires for a resumed, partial epoch).

    Example::

        @hookimpl
        def on_epoch_begin(trainer, state, epoch):
            print(f"epoch {epoch}")
    """


@hookspec
def on_step_begin(trainer: Trainer, state: TrainState, micro_batches: list[MicroBatch]) -> None:
    """All micro-batches of a step are fetched; forward/backward is about to start.

    ``micro_batches`` are the :class:`~hyper_core.types.MicroBatch` objects (still on the host).

    Example::

        @hookimpl
        def on_step_begin(trainer, state, micro_batches):
            images = sum(mb.num_images for mb in micro_batches)
            print(f"step {state.global_step + 1}: {images} images")
    """


@hookspec
def on_micro_step_end(
    trainer: Trainer, state: TrainState, micro_step: int, loss: torch.Tensor
) -> None:
    """One micro-batch's forward and backward finished. ``loss`` is its (scaled) loss tensor.

    Example::

        @hookimpl
        def on_micro_step_end(trainer, state, micro_step, loss):
            assert torch.isfinite(loss), f"non-finite loss in micro-step {micro_step}"
    """


@hookspec
def on_step_end(
    trainer: Trainer,
    state: TrainState,
    loss: float,
    loss_dict: dict[str, float],
    grad_norm: float | None,
) -> None:
    """An optimizer step finished and ``state.global_step`` was incremented.

    ``loss`` is the global loss of the step (all ranks), ``grad_norm`` the norm before clipping.

    Example::

        @hookimpl
        def on_step_end(trainer, state, loss, loss_dict, grad_norm):
            if grad_norm is not None and grad_norm > 100:
                print(f"step {state.global_step}: grad norm {grad_norm:.1f}")
    """


@hookspec
def on_log(trainer: Trainer, state: TrainState, metrics: dict[str, Any]) -> None:
    """Metrics of a logged step (every ``[logging] every_steps``). Runs on every rank.

    Implementations may add keys to ``metrics`` (they are written to ``metrics.jsonl`` after this
    hook returns, on rank 0).

    Example::

        @hookimpl
        def on_log(trainer, state, metrics):
            metrics["lr_x1000"] = metrics["lr"] * 1000  # written to metrics.jsonl
    """


@hookspec
def on_evaluate(trainer: Trainer, state: TrainState, metrics: dict[str, Any]) -> None:
    """An evaluation finished; ``metrics`` holds ``eval_loss`` and whatever plugins added.

    Example::

        @hookimpl
        def on_evaluate(trainer, state, metrics):
            print("eval loss", metrics["eval_loss"])
    """


@hookspec
def on_save_checkpoint(trainer: Trainer, state: TrainState, plugin_state: dict[str, Any]) -> None:
    """A checkpoint is being written: store this plugin's state in ``plugin_state`` under its
    own key.

    Each rank saves its ``plugin_state`` with the checkpoint, and ``on_load_checkpoint`` gets it
    back on resume. It is read with ``torch.load(weights_only=True)``, so store only plain
    data: dicts, lists, tuples, strings, numbers, booleans, ``None`` and tensors (no objects of
    your own classes).

    Example::

        @hookimpl
        def on_save_checkpoint(trainer, state, plugin_state):
            plugin_state["my_plugin"] = {"seen_images": COUNTER.value}
    """


@hookspec
def on_load_checkpoint(trainer: Trainer, state: TrainState, plugin_state: dict[str, Any]) -> None:
    """A checkpoint was restored; ``plugin_state`` is what ``on_save_checkpoint`` stored.

    Example::

        @hookimpl
        def on_load_checkpoint(trainer, state, plugin_state):
            COUNTER.value = plugin_state.get("my_plugin", {}).get("seen_images", 0)
    """


@hookspec
def on_epoch_end(trainer: Trainer, state: TrainState, epoch: int) -> None:
    """The train loader is exhausted for ``epoch``.

    Example::

        @hookimpl
        def on_epoch_end(trainer, state, epoch):
            print(f"epoch {epoch} done at step {state.global_step}")
    """


@hookspec
def on_train_end(trainer: Trainer, state: TrainState) -> None:
    """The run finished normally (also after a clean stop on SIGTERM/Ctrl-C).

    Example::

        @hookimpl
        def on_train_end(trainer, state):
            print(f"finished after {state.global_step} steps")
    """


@hookspec
def on_train_error(trainer: Trainer, state: TrainState, exc: BaseException) -> None:
    """The run failed with ``exc``. The original exception propagates after this hook.

    An exception raised by an implementation is logged, never raised over ``exc``.

    Example::

        @hookimpl
        def on_train_error(trainer, state, exc):
            dump_debug_state(trainer, reason=repr(exc))  # the error still propagates
    """


# --------------------------------------------------------------------------------------------
# Command hooks (firstresult)
# --------------------------------------------------------------------------------------------


@hookspec(firstresult=True)
def export_checkpoint(
    config: Config,
    registries: Registries,
    checkpoint: Path,
    out_dir: Path,
    options: ExportOptions,
) -> Path | None:
    """Write the checkpoint of a run as a model others can load (``hyper-train export``, and
    ``[checkpoint] export_hf`` on rank 0 with the run's final checkpoint).

    ``checkpoint`` is the resolved ``checkpoints/step-N`` folder, ``config`` the run's config,
    ``options`` the command's :class:`~hyper_core.export.ExportOptions` (``max_shard_size``,
    ``dtype``, ``merge``; at the end of a run ``dtype`` is ``[checkpoint] export_dtype``).
    Return the directory written, or ``None`` to leave the checkpoint to the next
    implementation. Without one the core writes the full model in the Hugging Face layout
    (:func:`hyper_core.export.export_checkpoint`); a plugin whose runs checkpoint something
    else (e.g. only adapters, as ``hyper-train-peft``) writes its own format here.

    Example::

        @hookimpl
        def export_checkpoint(config, checkpoint, out_dir, options):
            if not config.section("my_plugin").enabled:
                return None  # the core writes the full model
            write_my_format(checkpoint, out_dir)  # e.g. only the weights the plugin trained
            return out_dir
    """


@hookspec(firstresult=True)
def load_checkpoint_model(
    config: Config, registries: Registries, checkpoint: Path
) -> tuple[ModelAdapter, torch.nn.Module] | None:
    """The adapter and the trained model of a run's checkpoint, on the CPU, for inference
    (``hyper-train chat``).

    ``checkpoint`` is the resolved ``checkpoints/step-N`` folder, or an exported folder that
    records its run's config (e.g. ``hyper-train-peft``'s adapter directory); ``config`` the
    run's config. Return ``None`` to leave it to the next implementation; without one the core
    builds the model as configured and loads every weight from the checkpoint
    (:func:`hyper_core.trained_model.load_checkpoint_model`). A plugin whose checkpoints hold part
    of the model (e.g. only LoRA adapters) rebuilds the rest here.

    Example::

        @hookimpl
        def load_checkpoint_model(config, registries, checkpoint):
            if not config.section("my_plugin").enabled:
                return None  # the core loads the full model
            return load_my_format(config, registries, checkpoint)  # (adapter, model)
    """
