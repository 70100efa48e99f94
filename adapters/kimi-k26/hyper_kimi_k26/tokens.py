"""Kimi special tokens, the Kimi chat format and the offline demo tokenizer (no torch here).

The Kimi-K2.x chat format (as the checkpoints' ``chat_template.jinja`` renders it, non-thinking
"instant" turns) is::

    <|im_system|>system<|im_middle|>You are Kimi, an AI assistant created by Moonshot AI.<|im_end|>
    <|im_user|>user<|im_middle|>{text and images}<|im_end|>
    <|im_assistant|>assistant<|im_middle|><think></think>{answer}<|im_end|>

with no newlines between messages (they are shown on separate lines here only). A default
system turn is inserted when the conversation has none. Every image is
``<|media_begin|>image<|media_content|>`` + ``<|media_pad|>`` × N + ``<|media_end|>``, N being
the number of merged 2×2 patch groups. The loss covers the answer and its ``<|im_end|>``; the
role header and the empty ``<think></think>`` (what the generation prompt ends with in instant
mode) carry none.

The offline tokenizer (:func:`hyper_core.data.tokenizer.build_offline_tokenizer`) gives the
special tokens the ids ``0..n-1`` in the order ``[pad, eos, *SPECIAL_TOKENS]`` (duplicates
dropped); the tiny configs use those ids (:data:`OFFLINE_IDS`). The real checkpoints' ids
(Kimi's 163840-token tiktoken vocabulary) are in :data:`CHECKPOINT_IDS`.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

import attrs

from hyper_core.data.chat import ChatFormat

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerFast

PAD_TOKEN = "[PAD]"
BOS_TOKEN = "[BOS]"
EOS_TOKEN = "[EOS]"
IM_END = "<|im_end|>"
IM_USER = "<|im_user|>"
IM_ASSISTANT = "<|im_assistant|>"
IM_SYSTEM = "<|im_system|>"
IM_MIDDLE = "<|im_middle|>"
MEDIA_BEGIN = "<|media_begin|>"
MEDIA_CONTENT = "<|media_content|>"
MEDIA_END = "<|media_end|>"
MEDIA_PAD = "<|media_pad|>"
THINK_START = "<think>"
THINK_END = "</think>"
VIDEO_PLACEHOLDER = "<|kimi_k25_video_placeholder|>"

#: The text around an image's ``<|media_pad|>`` run.
IMAGE_PREFIX = f"{MEDIA_BEGIN}image{MEDIA_CONTENT}"
IMAGE_SUFFIX = MEDIA_END
#: One image in a prompt before expansion (what the chat template writes).
IMAGE_PLACEHOLDER = f"{IMAGE_PREFIX}{MEDIA_PAD}{IMAGE_SUFFIX}"

DEFAULT_SYSTEM = "You are Kimi, an AI assistant created by Moonshot AI."
#: What opens every assistant turn without reasoning (and the instant-mode generation prompt).
EMPTY_THINK = f"{THINK_START}{THINK_END}"

SPECIAL_TOKENS: tuple[str, ...] = (
    BOS_TOKEN,
    EOS_TOKEN,
    IM_USER,
    IM_ASSISTANT,
    IM_SYSTEM,
    IM_MIDDLE,
    MEDIA_BEGIN,
    MEDIA_CONTENT,
    MEDIA_END,
    MEDIA_PAD,
    THINK_START,
    THINK_END,
    VIDEO_PLACEHOLDER,
)

#: Ids of the special tokens in the offline demo tokenizer (pad and eos first).
OFFLINE_IDS: dict[str, int] = {
    tok: i for i, tok in enumerate(dict.fromkeys([PAD_TOKEN, IM_END, *SPECIAL_TOKENS]))
}
OFFLINE_VOCAB_SIZE = 512

#: Ids of the same tokens in the published Kimi-K2.5/K2.6 tokenizer (163840 tokens).
CHECKPOINT_IDS: dict[str, int] = {
    BOS_TOKEN: 163584,
    EOS_TOKEN: 163585,
    IM_END: 163586,
    IM_USER: 163587,
    IM_ASSISTANT: 163588,
    IM_SYSTEM: 163594,
    IM_MIDDLE: 163601,
    MEDIA_BEGIN: 163602,
    MEDIA_CONTENT: 163603,
    MEDIA_END: 163604,
    MEDIA_PAD: 163605,
    THINK_START: 163606,
    THINK_END: 163607,
    PAD_TOKEN: 163839,
}
CHECKPOINT_VOCAB_SIZE = 163840

#: The config attributes naming special-token ids, and their tokens (the video id of the
#: published config, 163840, is a placeholder outside the vocabulary and is not checked).
CONFIG_TOKEN_FIELDS: dict[str, str] = {
    "image_token_id": MEDIA_PAD,
    "vision_start_token_id": MEDIA_BEGIN,
    "vision_end_token_id": MEDIA_END,
}

#: Extra text the offline tokenizer learns merges from (the format's words).
_CORPUS: tuple[str, ...] = (
    *([f"{DEFAULT_SYSTEM} system user assistant image"] * 16),
    "Kimi Moonshot AI assistant created",
)


@attrs.frozen(kw_only=True)
class KimiChatFormat(ChatFormat):
    """The Kimi format: ``<|im_{role}|>{role}<|im_middle|>`` headers, ``<|im_end|>`` ends.

    Assistant headers are followed by ``assistant_preamble`` (``<think></think>``), which
    carries no loss. :attr:`chat_template` renders images as Kimi's media placeholder.
    """

    assistant_preamble: str = EMPTY_THINK

    def prefix(self, role: str) -> str:
        """The header of a message of ``role`` (both ``{role}`` occurrences filled)."""
        head = self.message_prefix.replace("{role}", role)
        return head + self.assistant_preamble if role == "assistant" else head

    @property
    def chat_template(self) -> str:
        """A Jinja template for HF ``apply_chat_template`` that renders like :meth:`render`
        (images as :data:`IMAGE_PLACEHOLDER`, to be expanded by the processor)."""
        return kimi_chat_template(self)


#: The Kimi chat format used for training (see the module docstring).
KIMI_CHAT = KimiChatFormat(
    message_prefix="<|im_{role}|>{role}<|im_middle|>",
    message_suffix=IM_END,
    default_system=DEFAULT_SYSTEM,
)


def _lit(text: str) -> str:
    return "{{- " + json.dumps(text, ensure_ascii=False) + " -}}"


def kimi_chat_template(fmt: KimiChatFormat = KIMI_CHAT) -> str:
    """A Jinja chat template rendering like ``fmt`` (used when a directory ships none)."""
    system = ""
    if fmt.default_system is not None:
        system = (
            "{%- if loop.first and message['role'] != 'system' -%}"
            + _lit(fmt.prefix("system") + fmt.default_system + fmt.message_suffix)
            + "{%- endif -%}"
        )
    before, has_role, rest = fmt.message_prefix.partition("{role}")
    header = _lit(before)
    while has_role:  # every {role} of the prefix, like ChatFormat.prefix
        middle, has_role, rest = rest.partition("{role}")
        header += "{{- message['role'] -}}" + _lit(middle)
    return (
        "{%- for message in messages -%}"
        + system
        + header
        + "{%- if message['role'] == 'assistant' -%}"
        + _lit(fmt.assistant_preamble)
        + "{%- endif -%}"
        "{%- if message['content'] is string -%}{{- message['content'] -}}"
        "{%- else -%}{%- for part in message['content'] -%}"
        "{%- if part['type'] == 'image' -%}"
        + _lit(IMAGE_PLACEHOLDER)
        + "{%- elif part['type'] == 'text' -%}{{- part['text'] -}}"
        "{%- endif -%}{%- endfor -%}{%- endif -%}" + _lit(fmt.message_suffix) + "{%- endfor -%}"
        "{%- if add_generation_prompt -%}" + _lit(fmt.prefix("assistant")) + "{%- endif -%}"
    )


KIMI_CHAT_TEMPLATE = kimi_chat_template(KIMI_CHAT)


def build_demo_tokenizer(chat_template: str | None = KIMI_CHAT_TEMPLATE) -> PreTrainedTokenizerFast:
    """The offline byte-level BPE tokenizer with Kimi's special tokens (:data:`OFFLINE_IDS`)."""
    from hyper_core.data.tokenizer import build_offline_tokenizer

    return build_offline_tokenizer(
        special_tokens=SPECIAL_TOKENS,
        corpus=_CORPUS,
        vocab_size=OFFLINE_VOCAB_SIZE,
        chat_template=chat_template,
        pad_token=PAD_TOKEN,
        eos_token=IM_END,
    )
