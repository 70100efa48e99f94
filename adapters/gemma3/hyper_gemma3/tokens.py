"""Gemma 3's special tokens, chat format and the offline demo tokenizer (no torch here).

The offline tokenizer (:func:`hyper_core.data.tokenizer.build_offline_tokenizer`) numbers the
special tokens ``0..n-1`` in the order ``[pad, eos, *special_tokens, *named]``, so the ids
below are fixed and the tiny config uses them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from hyper_core.data.chat import ChatFormat

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerFast

PAD = "<pad>"
EOS = "<eos>"
BOS = "<bos>"
START_OF_TURN = "<start_of_turn>"
END_OF_TURN = "<end_of_turn>"
BOI = "<start_of_image>"
EOI = "<end_of_image>"
IMAGE_SOFT = "<image_soft_token>"

#: The names stock ``Gemma3Processor`` reads from the tokenizer (``tokenizer.boi_token``...).
NAMED_TOKENS: dict[str, str] = {"boi_token": BOI, "eoi_token": EOI, "image_token": IMAGE_SOFT}
SPECIAL_TOKENS: tuple[str, ...] = (BOS, START_OF_TURN, END_OF_TURN)

#: ``<pad>`` 0, ``<eos>`` 1, ``<bos>`` 2, ``<start_of_turn>`` 3, ``<end_of_turn>`` 4,
#: ``<start_of_image>`` 5, ``<end_of_image>`` 6, ``<image_soft_token>`` 7.
OFFLINE_IDS: dict[str, int] = {
    tok: i
    for i, tok in enumerate(dict.fromkeys([PAD, EOS, *SPECIAL_TOKENS, *NAMED_TOKENS.values()]))
}
OFFLINE_VOCAB_SIZE = 512

#: Gemma's turns: ``<start_of_turn>user\n...<end_of_turn>\n``, the assistant's role written
#: ``model``; ``<bos>`` once at the start. The loss covers the answer and ``<end_of_turn>``.
CHAT_FORMAT = ChatFormat(
    message_prefix=START_OF_TURN + "{role}\n",
    message_suffix=END_OF_TURN + "\n",
    bos=BOS,
    role_prefixes={"assistant": START_OF_TURN + "model\n"},
)
#: The same format for ``apply_chat_template``; an image part is written ``<start_of_image>``,
#: which stock ``Gemma3Processor`` expands (saved with exports).
CHAT_TEMPLATE = CHAT_FORMAT.template(image=BOI)


def build_demo_tokenizer() -> PreTrainedTokenizerFast:
    """The offline byte-level BPE tokenizer with Gemma 3's special tokens (ids above)."""
    from hyper_core.data.tokenizer import build_offline_tokenizer

    return build_offline_tokenizer(
        special_tokens=SPECIAL_TOKENS,
        named_special_tokens=NAMED_TOKENS,
        vocab_size=OFFLINE_VOCAB_SIZE,
        chat_template=CHAT_TEMPLATE,
        pad_token=PAD,
        eos_token=EOS,
    )
