"""The core's default build stages, registered ``trylast`` so that plugins can replace them.

Each function is a hook implementation of :mod:`hyper_core.hookspecs`; read them as the
reference of what a stage must return.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import attrs

from ..errors import ConfigError
from ..hookspecs import hookimpl

default = hookimpl(trylast=True)


@default
def setup_distributed(config: Any) -> Any:
    """Seed, pick the device, and join the torchrun process group when there is one."""
    from ..parallel.setup import init_distributed

    return init_distributed(config)


@default
def plan_load(config: Any, adapter: Any, dist: Any, strategy: Any) -> Any:
    """:meth:`LoadPlan.for_run <hyper_core.parallel.load_plan.LoadPlan.for_run>`."""
    from ..parallel.load_plan import LoadPlan

    return LoadPlan.for_run(dist, strategy, adapter, config.model)


@default
def build_model(config: Any, adapter: Any, dist: Any, load: Any) -> Any:
    """The adapter's model with ``[model] freeze`` applied: on this rank's device, or with
    ``load.meta_init`` in full on rank 0's CPU and on meta elsewhere (the strategy
    materialises it; see :mod:`hyper_core.parallel.materialize`)."""
    from ..parallel.materialize import build_model_on_rank

    model = build_model_on_rank(adapter, config.model, dist, load)
    freeze(model, adapter, config.model.freeze)
    return model


def freeze(model: Any, adapter: Any, groups: list[str]) -> None:
    """Turn off gradients of the named groups (vision, projector, language)."""
    if not groups:
        return
    available = adapter.freeze_groups(model)
    for group in groups:
        if group not in available:
            raise ConfigError(
                [
                    (
                        "$.model.freeze",
                        f"adapter {adapter.name!r} has no {group!r} group "
                        f"(available: {', '.join(sorted(available))})",
                    )
                ]
            )
        for path in available[group]:
            model.get_submodule(path).requires_grad_(False)
    if not any(p.requires_grad for p in model.parameters()):
        raise ConfigError([("$.model.freeze", "every parameter is frozen; nothing to train")])


@default
def parallelize_model(
    config: Any, model: Any, adapter: Any, dist: Any, strategy: Any, load: Any
) -> Any:
    """liger-kernel's fused kernels (``[training] liger_kernel``), activation checkpointing
    and ``[training] compile`` per sharding unit, then the strategy (told ``load`` in its
    plan); with ``load.sharded_load`` each rank then reads its shards of ``[model] path`` and
    the strategy hears of it (``weights_loaded``)."""
    from ..adapters.base import ContextParallelAdapter

    plan = attrs.evolve(adapter.parallel_plan(model), load=load)
    if config.parallel.cp > 1 and isinstance(adapter, ContextParallelAdapter):
        plan = attrs.evolve(plan, context_parallel=adapter)
    if config.parallel.ep > 1:
        from ..parallel.expert_parallel import expert_parallel_plan

        plan = expert_parallel_plan(plan, model, adapter, strategy, dist, config.parallel.ep)
    training = config.training
    if training.liger_kernel:
        from ..parallel.liger import apply_liger_kernel

        apply_liger_kernel(model, dist.device)
    if "none" != training.activation_checkpointing or training.vision_activation_checkpointing:
        from ..parallel.checkpointing import apply_activation_checkpointing

        apply_activation_checkpointing(
            model,
            plan,
            training.activation_checkpointing,
            training.vision_activation_checkpointing,
            training.activation_checkpointing_every,
        )
    if config.training.compile:
        from ..parallel.compile import apply_regional_compile

        apply_regional_compile(model, plan)
    if not load.sharded_load:
        return strategy.apply(model, plan, dist)
    from ..parallel.hf_load import load_hf_shards

    adapter.check_weights(config.model)  # no safetensors, quantized: before any rank reads
    conversions = adapter.checkpoint_conversions(model)  # before sharding renames classes
    model = strategy.apply(model, plan, dist)
    path = Path(config.model.path)
    load_hf_shards(strategy.unwrap(model), path, dist, conversions, view=load.checkpoint_view)
    strategy.weights_loaded(model)
    return model


@default
def build_loss(config: Any, adapter: Any) -> Any:
    """The adapter's ``loss_fn`` if it has one, else the causal-LM loss."""
    from ..step.loss import causal_lm_loss

    return getattr(adapter, "loss_fn", None) or causal_lm_loss


@default
def build_model_assets(config: Any, adapter: Any) -> Any:
    """Tokenizer and processor from the adapter."""
    return adapter.build_assets(config.model)


@default
def build_data_transform(config: Any, adapter: Any, assets: Any) -> Any:
    """``adapter.transform`` bound to the assets and ``max_seq_len`` (picklable)."""
    return functools.partial(adapter.transform, assets=assets, max_seq_len=config.data.max_seq_len)


def _image_dir(value: str, base_dir: Path, where: str) -> Path:
    path = Path(value).expanduser()
    path = (path if path.is_absolute() else base_dir / path).resolve()
    if not path.is_dir():
        raise ConfigError([(where, f"image directory not found: {path}")])
    return path


def _load_source(sources: Any, config: Any, registries: Any, key: str) -> Sequence[dict[str, Any]]:
    """The raw samples of ``[data] KEY``: each source's files (globs expanded) in order, mixed
    by their weights (:mod:`hyper_core.data.sources`)."""
    from ..config.schema import source_list
    from ..data.sources import expand_path, mix

    base_dir = Path(config.source_path).parent if config.source_path else Path.cwd()
    parts: list[Sequence[dict[str, Any]]] = []
    weights: list[float] = []
    for where, source in source_list(sources, f"$.data.{key}"):
        paths = [source.path] if source.path is None else expand_path(source.path, base_dir, where)
        for path in paths:
            parts.append(_load_file(source, path, config, registries, where, base_dir))
            weights.append(source.weight)
    return mix(parts, weights, config.run.seed)


def _load_file(
    source: Any, path: str | None, config: Any, registries: Any, where: str, base_dir: Path
) -> Sequence[dict[str, Any]]:
    """The raw samples of one file of a source; with ``image_dir`` (or ``[data] image_root``)
    each sample's ``_image_dir`` says where its relative image paths resolve. A format
    registered with an ``options`` class gets its options as an instance of it."""
    from ..config.fields import format_options
    from ..data.jsonl import IMAGE_DIR_KEY, WithImageDir
    from ..resolve import dataset_format

    fmt, options_class = dataset_format(f"{where}.format", registries, source.format)
    image_dir = None
    if source.image_dir is not None:
        image_dir = _image_dir(source.image_dir, base_dir, f"{where}.image_dir")
    elif config.data.image_root is not None:
        image_dir = _image_dir(config.data.image_root, base_dir, "$.data.image_root")
    options = format_options(options_class, source.options, where)
    samples = fmt(path, options, base_dir)
    if not isinstance(samples, Sequence):
        samples = list(samples)
    if image_dir is None:
        return samples
    if not isinstance(samples, list):  # lazy: set on access
        return WithImageDir(samples, str(image_dir))
    for sample in samples:  # formats return fresh dicts
        sample[IMAGE_DIR_KEY] = str(image_dir)
    return samples


@default
def build_dataset(config: Any, transform: Any, dist: Any, registries: Any) -> Any:
    """Read the train/eval sources through their registered formats; transform lazily."""
    from ..data.dataset import DatasetSplits, TransformedDataset

    data = config.data
    train = TransformedDataset(
        _load_source(data.train, config, registries, "train"), transform, data.on_error
    )
    evaluation = None
    if data.eval is not None:
        raw = _load_source(data.eval, config, registries, "eval")
        if data.eval_samples is not None:
            raw = raw[: data.eval_samples]
        evaluation = TransformedDataset(raw, transform, data.on_error)
    return DatasetSplits(train=train, eval=evaluation)


@default
def build_collate_fn(config: Any, runtime: Any, assets: Any) -> Any:
    """The batching runtime's ``collate``; with ``[data] max_tokens_per_micro_batch``, its
    micro-batches filled up to that many tokens (packed batching only)."""
    budget = config.data.max_tokens_per_micro_batch
    if budget is None:
        return runtime.collate
    from ..batching.token_budget import TokenBudgetCollate

    return TokenBudgetCollate(runtime, budget)


@default
def build_dataloader(config: Any, datasets: Any, collate_fn: Any, dist: Any) -> Any:
    """A resumable, rank-sharded step loader for train (its steps shared among the ranks by
    tokens with ``[data] max_tokens_per_micro_batch``, regrouped within ``[data] buffer_size``
    steps); a single-pass loader for eval."""
    from ..data.step_loader import StepLoader, StepSampler
    from ..trainer.trainer import check_batch_sizes
    from ..types import DataLoaders

    t, data = config.training, config.data
    check_batch_sizes(config, dist.dp_size)

    def loader(
        dataset: Any, shuffle: bool, balance_ranks: bool = False, buffer_steps: int = 1
    ) -> Any:
        sampler = StepSampler(
            num_samples=len(dataset),
            global_batch_size=t.global_batch_size,
            rank=dist.rank,
            world_size=dist.world_size,
            shuffle=shuffle,
            seed=config.run.seed,
        )
        return StepLoader(
            dataset,
            collate_fn,
            sampler,
            num_workers=data.num_workers,
            pin_memory=dist.device is not None and dist.device.type == "cuda",
            balance_ranks=balance_ranks,
            buffer_steps=buffer_steps,
        )

    budget = data.max_tokens_per_micro_batch is not None
    train = loader(datasets.train, data.shuffle, budget, data.buffer_size)
    evaluation = loader(datasets.eval, False) if datasets.eval is not None else None
    return DataLoaders(train=train, eval=evaluation)


@default
def build_get_batch(config: Any, runtime: Any, dist: Any) -> Any:
    """Move one micro-batch to this rank's device: ``(model_inputs, loss_inputs)``."""
    return functools.partial(runtime.to_device, device=dist.device)


@default
def compute_train_iters(config: Any, dataloaders: Any, dist: Any) -> Any:
    """``[training] steps``, or ``epochs`` × the loader's steps per epoch."""
    t = config.training
    if t.steps is not None:
        return t.steps
    return t.epochs * dataloaders.train.steps_per_epoch


@default
def build_optimizer(config: Any, model: Any) -> Any:
    """AdamW (no weight decay on 1-D parameters with ``no_decay_1d``)."""
    from ..step.optim import build_adamw

    return build_adamw(model, config.training)


@default
def build_lr_scheduler(config: Any, optimizer: Any, train_iters: int) -> Any:
    """Linear warmup, then constant, linear or cosine decay to ``min_lr_ratio``."""
    from ..step.optim import build_scheduler

    return build_scheduler(optimizer, config.training, train_iters)


@default
def build_training_context(config: Any, model: Any, dist: Any) -> Any:
    """bf16 autocast with ``mixed_precision = "bf16"``, else no context.

    Under fsdp2 too, although its gathered parameters are already bf16 there: autocast then
    copies no weights, and it still covers ops on non-parameter inputs (fp32 buffers, inputs
    made outside the sharding units)."""
    if config.training.mixed_precision == "bf16":
        import torch

        return functools.partial(torch.autocast, device_type=dist.device.type, dtype=torch.bfloat16)
    return contextlib.nullcontext


@default
def build_evaluator(
    config: Any,
    dist: Any,
    adapter: Any,
    strategy: Any,
    model: Any,
    loss_fn: Any,
    assets: Any,
    dataloaders: Any,
    get_batch: Any,
    training_context: Any,
    lockstep: Any,
) -> Any:
    """Eval loss by ``loss_fn``, perplexity, token accuracy, exact match and generations."""
    from ..trainer.evaluate import DefaultEvaluator

    return DefaultEvaluator(
        config=config,
        dist=dist,
        adapter=adapter,
        model=model,
        unwrapped_model=strategy.unwrap(model) if strategy is not None else model,
        loss_fn=loss_fn,
        assets=assets,
        loader=dataloaders.eval,
        get_batch=get_batch,
        training_context=training_context,
        lockstep=lockstep,
    )


@default
def build_checkpointer(
    config: Any, dist: Any, model: Any, optimizer: Any, lr_scheduler: Any, dataloaders: Any
) -> Any:
    """DCP checkpoints of these objects under ``output_dir/checkpoints``."""
    from ..checkpoint import Checkpointer

    return Checkpointer(
        config,
        dist,
        model=model,
        optimizer=optimizer,
        lr_scheduler=lr_scheduler,
        dataloaders=dataloaders,
    )
