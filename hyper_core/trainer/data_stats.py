"""``hyper-train data stats``: the train data read through the plugin host's asset, transform
and dataset stages, as a run would, without building the model."""

from __future__ import annotations

from typing import Any

import attrs

from ..batching.token_budget import check_token_budget
from ..data.stats import Batching, DataStats, collect_stats


@attrs.frozen
class PreparedData:
    """The adapter, its assets and the datasets a run would read, without the model."""

    adapter: Any
    assets: Any
    datasets: Any


def prepare_data(config: Any, host: Any) -> PreparedData:
    """The train (and eval) datasets through the plugin host's asset, transform and dataset
    stages, as a run builds them, without building the model."""
    from ..parallel.env import DistEnv
    from ..resolve import resolve_adapter

    adapter = resolve_adapter(config.model, host.registries)
    assets = host.call_stage("build_model_assets", config=config, adapter=adapter)
    transform = host.call_stage(
        "build_data_transform", config=config, adapter=adapter, assets=assets
    )
    datasets = host.call_stage(
        "build_dataset",
        config=config,
        transform=transform,
        dist=DistEnv(),
        registries=host.registries,
    )
    return PreparedData(adapter, assets, datasets)


def data_stats(config: Any, host: Any, *, limit: int | None, world_size: int = 1) -> DataStats:
    """The train data's stats through the plugin host's asset, transform and dataset stages,
    without building the model."""
    from ..batching.resolve import resolve_runtime

    prepared = prepare_data(config, host)
    adapter, assets, datasets = prepared.adapter, prepared.assets, prepared.datasets
    runtime = resolve_runtime(config, adapter, assets, host.registries)
    check_token_budget(runtime.name, config.data.max_tokens_per_micro_batch)
    t = config.training
    batching = Batching(
        global_batch_size=t.global_batch_size,
        micro_batch_size=t.micro_batch_size,
        world_size=world_size,
        pad_to_multiple_of=runtime.options.pad_to_multiple_of,
        max_tokens=config.data.max_tokens_per_micro_batch,
        buffer_steps=config.data.buffer_size,
    )
    processor = getattr(assets, "processor", None)
    return collect_stats(
        datasets.train,
        limit=limit,
        batching=batching,
        runtime=runtime.name,
        image_token_id=getattr(processor, "image_token_id", None),
        video_token_id=getattr(processor, "video_token_id", None),
    )
