"""Qwen-VL special tokens and the offline demo tokenizer (no torch here).

The offline tokenizer (:func:`hyper_core.data.tokenizer.build_offline_tokenizer`) gives special
tokens the ids ``0..n-1`` in the order ``[pad, eos, *special_tokens]`` with duplicates dropped,
so the ids below are fixed and the tiny configs use them.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerFast

PAD_TOKEN = "<|endoftext|>"
EOS_TOKEN = "<|im_end|>"
IM_START = "<|im_start|>"
VISION_START = "<|vision_start|>"
VISION_END = "<|vision_end|>"
IMAGE_PAD = "<|image_pad|>"
VIDEO_PAD = "<|video_pad|>"

VISION_TOKENS: tuple[str, ...] = (VISION_START, VISION_END, IMAGE_PAD, VIDEO_PAD)
SPECIAL_TOKENS: tuple[str, ...] = (PAD_TOKEN, IM_START, EOS_TOKEN, *VISION_TOKENS)

#: Ids of the special tokens in the offline demo tokenizer: ``<|endoftext|>`` 0, ``<|im_end|>``
#: 1, ``<|im_start|>`` 2, ``<|vision_start|>`` 3, ``<|vision_end|>`` 4, ``<|image_pad|>`` 5,
#: ``<|video_pad|>`` 6.
OFFLINE_IDS: dict[str, int] = {
    tok: i for i, tok in enumerate(dict.fromkeys([PAD_TOKEN, EOS_TOKEN, *SPECIAL_TOKENS]))
}
OFFLINE_VOCAB_SIZE = 512

#: The config attributes naming special-token ids, and their tokens.
CONFIG_TOKEN_FIELDS: dict[str, str] = {
    "image_token_id": IMAGE_PAD,
    "video_token_id": VIDEO_PAD,
    "vision_start_token_id": VISION_START,
    "vision_end_token_id": VISION_END,
}


def _lit(text: str) -> str:
    return "{{- " + json.dumps(text, ensure_ascii=False) + " -}}"


def _vl_chat_template(default_system: str | None) -> str:
    """A Jinja chat template rendering like the adapter's ChatML transform, images included.

    Every literal is emitted through ``{{- "..." -}}`` so that whitespace control never eats
    the newlines of the format.
    """
    system = ""
    if default_system is not None:
        system = (
            "{%- if loop.first and message['role'] != 'system' -%}"
            + _lit(f"{IM_START}system\n{default_system}{EOS_TOKEN}\n")
            + "{%- endif -%}"
        )
    return (
        "{%- for message in messages -%}"
        + system
        + _lit(IM_START)
        + "{{- message['role'] -}}"
        + _lit("\n")
        + "{%- if message['content'] is string -%}{{- message['content'] -}}"
        "{%- else -%}{%- for part in message['content'] -%}"
        "{%- if part['type'] == 'image' -%}"
        + _lit(VISION_START + IMAGE_PAD + VISION_END)
        + "{%- elif part['type'] == 'text' -%}{{- part['text'] -}}"
        "{%- endif -%}{%- endfor -%}{%- endif -%}" + _lit(EOS_TOKEN + "\n") + "{%- endfor -%}"
        "{%- if add_generation_prompt -%}" + _lit(IM_START + "assistant\n") + "{%- endif -%}"
    )


QWEN2_VL_CHAT_TEMPLATE = _vl_chat_template("You are a helpful assistant.")
QWEN3_VL_CHAT_TEMPLATE = _vl_chat_template(None)


def build_demo_tokenizer(chat_template: str | None = None) -> PreTrainedTokenizerFast:
    """The offline byte-level BPE tokenizer with the Qwen-VL special tokens (ids above)."""
    from hyper_core.data.tokenizer import build_offline_tokenizer

    # pad and eos: the core's defaults, ChatML's <|endoftext|> and <|im_end|>
    return build_offline_tokenizer(
        special_tokens=SPECIAL_TOKENS, vocab_size=OFFLINE_VOCAB_SIZE, chat_template=chat_template
    )
