"""The core's built-in components: the ``hf_causal_lm`` adapter, batching runtimes and parallel
strategies (dataset formats: :mod:`.formats`; the demo data: :mod:`hyper_core.demo.plugin`)."""

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
