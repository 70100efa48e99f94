"""The offline tokenizer of the tiny config (no downloads) and the chat format."""

from __future__ import annotations

from typing import Any

from hyper_core.data.chat import ChatFormat

IMAGE_TOKEN = "<image>"
PAD, EOS, IM_START = "<|endoftext|>", "<|im_end|>", "<|im_start|>"
#: The core's offline tokenizer numbers special tokens 0..n-1 as [pad, eos, *specials].
OFFLINE_IDS = {"pad": 0, "eos": 1, "im_start": 2, "image": 3}
OFFLINE_VOCAB_SIZE = 512

#: ChatML; the loss covers assistant content and ``<|im_end|>`` (the core renders it).
CHAT_FORMAT = ChatFormat(message_prefix=IM_START + "{role}\n", message_suffix=EOS + "\n")
#: The same format for ``apply_chat_template``, an image part written as ``<image>`` (what
#: transformers' ``LlavaProcessor`` expands): saved with exports.
CHAT_TEMPLATE = CHAT_FORMAT.template(image=IMAGE_TOKEN)


def build_offline_tokenizer() -> Any:
    """A byte-level BPE trained in-process, with the special tokens above."""
    from hyper_core.data.tokenizer import build_offline_tokenizer as build

    return build(
        special_tokens=(PAD, EOS, IM_START, IMAGE_TOKEN),
        vocab_size=OFFLINE_VOCAB_SIZE,
        chat_template=CHAT_TEMPLATE,
        pad_token=PAD,
        eos_token=EOS,
    )
