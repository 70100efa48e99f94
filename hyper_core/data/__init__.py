"""Data: reading, normalising, tokenising, sample datasets and the step loader.

Importing this package does not import torch: the torch-based names (``TransformedDataset``,
``Skipped``, ``DatasetSplits``, ``StepSampler``, ``StepLoader``, ``StepBatch``) load lazily on
first access.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from .chat import (
    QWEN_CHATML,
    QWEN_CHATML_TEMPLATE,
    ChatFormat,
    PiecewiseTokensWarning,
    TextChatTransform,
    TokenizedConversation,
    to_features,
    tokenize_conversation,
    tokenize_prompt,
)
from .conversation import (
    Conversation,
    ImagePart,
    Message,
    TextPart,
    load_image,
    load_images,
    parse_conversation,
)
from .errors import SampleError, SkipCounter
from .jsonl import RawSample, format_source, load_jsonl_format, read_jsonl
from .tokenizer import CHATML_SPECIAL_TOKENS, build_offline_tokenizer, special_token_ids

if TYPE_CHECKING:
    from .dataset import DatasetSplits, Skipped, TransformedDataset
    from .step_loader import StepBatch, StepLoader, StepSampler


class DatasetFormat(Protocol):
    """A registered dataset format: ``(path, options, base_dir) -> list of raw sample dicts``.

    ``path`` is the table's ``path`` (or the plain string of ``[data] train``), ``options`` the
    table's other keys (``format`` and the core's ``image_dir`` removed), ``base_dir`` the config
    file's directory. Return fresh dicts: the core may add keys (``_image_dir``).
    """

    def __call__(
        self, path: str | None, options: dict[str, Any], base_dir: Path
    ) -> list[dict[str, Any]]: ...


_LAZY = {
    "TransformedDataset": "dataset",
    "Skipped": "dataset",
    "DatasetSplits": "dataset",
    "StepSampler": "step_loader",
    "StepLoader": "step_loader",
    "StepBatch": "step_loader",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


__all__ = [
    "CHATML_SPECIAL_TOKENS",
    "QWEN_CHATML",
    "QWEN_CHATML_TEMPLATE",
    "ChatFormat",
    "Conversation",
    "DatasetFormat",
    "DatasetSplits",
    "ImagePart",
    "Message",
    "PiecewiseTokensWarning",
    "RawSample",
    "SampleError",
    "SkipCounter",
    "Skipped",
    "StepBatch",
    "StepLoader",
    "StepSampler",
    "TextChatTransform",
    "TextPart",
    "TokenizedConversation",
    "TransformedDataset",
    "build_offline_tokenizer",
    "format_source",
    "load_image",
    "load_images",
    "load_jsonl_format",
    "parse_conversation",
    "read_jsonl",
    "special_token_ids",
    "to_features",
    "tokenize_conversation",
    "tokenize_prompt",
]
