"""Helpers of the Qwen-VL adapter tests (a uniquely named module, importable from the tests)."""

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
from hyper_qwen_vl.adapters import (
    Qwen2VLAdapter,
    Qwen3VLAdapter,
    Qwen3VLMoeAdapter,
    Qwen25VLAdapter,
    QwenVLAdapter,
)

ADAPTERS: dict[str, type[QwenVLAdapter]] = {
    "qwen2_vl": Qwen2VLAdapter,
    "qwen2_5_vl": Qwen25VLAdapter,
    "qwen3_vl": Qwen3VLAdapter,
    "qwen3_vl_moe": Qwen3VLMoeAdapter,
}
FAMILIES = list(ADAPTERS)

#: name -> (height, width) of the test pictures.
IMAGE_SIZES = {"odd.png": (57, 93), "square.png": (112, 112), "wide.png": (40, 150)}


def model_config(name: str, **kwargs: Any) -> ModelConfig:
    """``[model]`` for adapter ``name`` (a tiny named config unless ``path`` is given)."""
    if "path" not in kwargs:
        kwargs.setdefault("config", "tiny")
    return ModelConfig(adapter=name, **kwargs)


@functools.cache
def cached_assets(name: str) -> ModelAssets:
    """The offline assets of adapter ``name`` (built once per session)."""
    return ADAPTERS[name]().build_assets(model_config(name))


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


def runtime(kind: str, pad_token_id: int = 0) -> PackedRuntime | PaddedRuntime:
    """The core ``packed`` or ``padded`` runtime."""
    options = BatchingOptions(micro_batch_size=8, max_seq_len=4096, pad_token_id=pad_token_id)
    return PackedRuntime(options) if kind == "packed" else PaddedRuntime(options)


def micro_batch(features: Sequence[SampleFeatures], kind: str) -> MicroBatch:
    """One micro-batch of ``features`` laid out by the core runtime ``kind``."""
    return runtime(kind).make_micro_batch(list(features))


def loss_of(model: torch.nn.Module, mb: MicroBatch, forward_kwargs: dict[str, Any]) -> torch.Tensor:
    """Sum of CE over the shifted labels / number of loss tokens."""
    from hyper_core.training.loss import causal_lm_loss

    outputs = model(**mb.model_inputs, **forward_kwargs)
    loss, _ = causal_lm_loss(outputs, mb.loss_inputs, float(mb.num_loss_tokens))
    return loss
