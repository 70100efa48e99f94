"""Deprecated: :mod:`hyper_core.inference` was split (issue #32). Generation is
:mod:`hyper_core.generation`, loading a trained model :mod:`hyper_core.trained_model`, and the
chat command's ``chat_lines``/``check_image`` are in :mod:`hyper_core.cli.chat`. This module
re-exports the first two's public names and will be removed."""

from __future__ import annotations

import warnings

from .generation import (
    ChatModel,
    GenerationSettings,
    build_prompt,
    decode,
    generate_answer_ids,
    generate_batch_ids,
    prompt_conversation,
)
from .trained_model import is_export_dir, load_chat_model, load_checkpoint_model

warnings.warn(
    "hyper_core.inference is deprecated: import from hyper_core.generation or "
    "hyper_core.trained_model",
    DeprecationWarning,
    stacklevel=2,
)

__all__ = [
    "ChatModel",
    "GenerationSettings",
    "build_prompt",
    "decode",
    "generate_answer_ids",
    "generate_batch_ids",
    "is_export_dir",
    "load_chat_model",
    "load_checkpoint_model",
    "prompt_conversation",
]
