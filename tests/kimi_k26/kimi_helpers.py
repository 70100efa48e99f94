"""Helpers of the Kimi-K2.6 adapter tests (a uniquely named module, importable from the tests)."""

from __future__ import annotations

import functools
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from hyper_core.adapters.base import ModelAssets
from hyper_core.batching.base import BatchingOptions
from hyper_core.batching.packed import PackedRuntime
from hyper_core.batching.padded import PaddedRuntime
from hyper_core.batching.types import MicroBatch, SampleFeatures
from hyper_core.config.schema import ModelConfig
from hyper_kimi_k26.adapter import KimiK25Adapter

#: name -> (height, width) of the test pictures.
IMAGE_SIZES = {"odd.png": (57, 93), "square.png": (112, 112), "wide.png": (40, 150)}


def model_config(**kwargs: Any) -> ModelConfig:
    """``[model]`` for the adapter (the tiny named config unless ``path`` is given)."""
    if "path" not in kwargs:
        kwargs.setdefault("config", "tiny")
    kwargs.setdefault("adapter", "kimi_k25")
    return ModelConfig(**kwargs)


@functools.cache
def cached_assets() -> ModelAssets:
    """The offline assets (built once per session)."""
    return KimiK25Adapter().build_assets(model_config())


def chat(user: Any, answer: str, image_dir: Path, **extra: Any) -> dict[str, Any]:
    """A raw sample whose relative image paths resolve against ``image_dir``."""
    return {
        "messages": [
            {"role": "user", "content": user},
            {"role": "assistant", "content": answer},
        ],
        "_source": {"file": str(image_dir / "data.jsonl"), "line": 1},
        **extra,
    }


def micro_batch(features: Sequence[SampleFeatures], kind: str) -> MicroBatch:
    """One micro-batch of ``features`` laid out by the core runtime ``kind``."""
    options = BatchingOptions(micro_batch_size=8, max_seq_len=4096, pad_token_id=0)
    runtime = PackedRuntime(options) if kind == "packed" else PaddedRuntime(options)
    return runtime.make_micro_batch(list(features))


def loss_of(
    model: torch.nn.Module, mb: MicroBatch, num_loss_tokens: float | None = None
) -> torch.Tensor:
    """Sum of CE over the shifted labels / ``num_loss_tokens`` (default: the micro-batch's)."""
    from hyper_core.training.loss import causal_lm_loss

    outputs = model(**mb.model_inputs, use_cache=False)
    loss, _ = causal_lm_loss(outputs, mb.loss_inputs, float(num_loss_tokens or mb.num_loss_tokens))
    return loss
