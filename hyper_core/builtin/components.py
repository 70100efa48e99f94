"""The core's built-in components: adapter, batching runtimes, strategies, dataset formats."""

from __future__ import annotations

from typing import Any

from ..hookspecs import hookimpl


@hookimpl
def register_model_adapters(register: Any) -> None:
    """``hf_causal_lm``: any transformers causal LM."""
    register("hf_causal_lm", "hyper_core.builtin.hf_causal_lm:HFCausalLMAdapter")


@hookimpl
def register_batching_runtimes(register: Any) -> None:
    """``padded`` and ``packed`` (padding-free)."""
    register("padded", "hyper_core.batching.padded:PaddedRuntime")
    register("packed", "hyper_core.batching.packed:PackedRuntime")


@hookimpl
def register_parallel_strategies(register: Any) -> None:
    """``none``, ``ddp``, ``fsdp2``."""
    register("none", "hyper_core.parallel.simple:NoParallel")
    register("ddp", "hyper_core.parallel.simple:DDP")
    register("fsdp2", "hyper_core.parallel.fsdp2:FSDP2", aliases=["fsdp", "hsdp"])


@hookimpl
def register_dataset_formats(register: Any) -> None:
    """``jsonl``, ``parquet`` and ``hf`` conversations, the synthetic ``shapes`` demo set and
    the video demo's ``moving_shapes`` clips."""
    data = "hyper_core.data"
    register("jsonl", f"{data}.jsonl:load_jsonl_format", options=f"{data}.jsonl:JsonlOptions")
    parquet_options = f"{data}.parquet:ParquetOptions"
    register("parquet", f"{data}.parquet:load_parquet_format", options=parquet_options)
    register("hf", f"{data}.parquet:load_hf_format", options=parquet_options)
    register("shapes", f"{data}.shapes:load_shapes_format", options=f"{data}.shapes:ShapesOptions")
    register(
        "moving_shapes",
        f"{data}.moving_shapes:load_moving_shapes_format",
        options=f"{data}.moving_shapes:MovingShapesOptions",
    )
