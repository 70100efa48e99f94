"""Training ids are the ids of the rendered conversation: equal to
``apply_chat_template(..., tokenize=True)`` of the format's template, for a byte-level BPE and a
SentencePiece-style tokenizer, ChatML and a format whose prefixes end in a space."""

from __future__ import annotations

import functools
import warnings

import pytest

from hyper_core.batching.types import IGNORE_INDEX
from hyper_core.data.chat import (
    QWEN_CHATML,
    ChatFormat,
    PiecewiseTokensWarning,
    tokenize_conversation,
    tokenize_prompt,
)
from hyper_core.data.conversation import Conversation, ImagePart, parse_conversation
from hyper_core.data.errors import SampleError
from hyper_core.data.tokenizer import CHATML_SPECIAL_TOKENS, build_offline_tokenizer
from hyper_core.testing.conformance_tokens import (
    EDGE_SAMPLES,
    assert_one_pass,
    describe_difference,
    template_ids,
)

IMAGE = "<image>"
END = "<end_of_utterance>"
SPECIALS = [*CHATML_SPECIAL_TOKENS, IMAGE, END]

#: An Idefics3-style format: every role prefix ends in a space, no special token after it.
SPACED = ChatFormat(
    message_prefix="{role}: ",
    message_suffix=f"{END}\n",
    bos="<|endoftext|>",
    role_prefixes={"user": "User: ", "assistant": "Assistant: "},
)
FORMATS = {"chatml": QWEN_CHATML, "spaced": SPACED}

CONVERSATIONS: list[dict] = [
    *EDGE_SAMPLES,
    {
        "messages": [
            {"role": "system", "content": "You answer  in one word. "},
            {"role": "user", "content": "What colour is the sky?"},
            {"role": "assistant", "content": "blue"},
            {"role": "user", "content": " And grass?"},
            {"role": "assistant", "content": "green "},
        ]
    },
    {
        "images": ["a.png", "b.png", "c.png"],
        "messages": [
            {"role": "user", "content": "<image> first <image>second"},
            {"role": "assistant", "content": "a square"},
            {"role": "user", "content": "and <image>"},
            {"role": "assistant", "content": " a circle"},
        ],
    },
]


@functools.cache
def _byte_level() -> object:
    return build_offline_tokenizer(special_tokens=SPECIALS)


@functools.cache
def _sentencepiece_style() -> object:
    """A BPE with SentencePiece's ``▁`` word starts (Metaspace), trained offline."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    raw = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True))
    raw.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first")
    raw.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="first")
    trainer = trainers.BpeTrainer(
        vocab_size=600,
        special_tokens=["<unk>", *SPECIALS],
        initial_alphabet=[f"<0x{b:02X}>" for b in range(256)],
        show_progress=False,
    )
    corpus = ["User: Assistant: system user assistant a square a circle blue green"] * 8
    raw.train_from_iterator([*corpus, "What colour is the sky? And grass? first second"], trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=raw, unk_token="<unk>", pad_token="<|endoftext|>", eos_token=END
    )


TOKENIZERS = {"byte_level": _byte_level, "sentencepiece": _sentencepiece_style}


def _expand(tokenizer, index: int, _part: ImagePart) -> list[int]:
    return [tokenizer.convert_tokens_to_ids(IMAGE)] * (index + 2)


def _with_template(tokenizer, fmt: ChatFormat):
    tokenizer.chat_template = fmt.template(image=IMAGE)
    return tokenizer


def _train(conv: Conversation, tokenizer, fmt: ChatFormat, **kwargs):
    return tokenize_conversation(
        conv,
        tokenizer,
        fmt,
        image_tokens=functools.partial(_expand, tokenizer),
        image_placeholder=IMAGE,
        max_seq_len=None,
        **kwargs,
    )


@pytest.mark.parametrize("tok_name", sorted(TOKENIZERS))
@pytest.mark.parametrize("fmt_name", sorted(FORMATS))
def test_training_ids_are_the_templates(tok_name: str, fmt_name: str) -> None:
    fmt = FORMATS[fmt_name]
    tokenizer = _with_template(TOKENIZERS[tok_name](), fmt)
    image_id = {tokenizer.convert_tokens_to_ids(IMAGE)}
    for i, sample in enumerate(CONVERSATIONS):
        conv = parse_conversation(sample)
        out = _train(conv, tokenizer, fmt)
        stock = template_ids(tokenizer, conv.to_messages(), generation=False)
        assert_one_pass(f"sample {i}", out.input_ids, stock, tokenizer, image_id)
        assert [out.input_ids[a:b] for a, b in out.image_spans] == [
            _expand(tokenizer, k, None) for k in range(conv.num_images)
        ]
        prompt, _ = conv.prompt_and_answer()
        ids = tokenize_prompt(
            prompt,
            tokenizer,
            fmt,
            image_tokens=functools.partial(_expand, tokenizer),
            image_placeholder=IMAGE,
        ).input_ids
        stock = template_ids(tokenizer, prompt.to_messages(), generation=True)
        assert_one_pass(f"sample {i}'s prompt", ids, stock, tokenizer, image_id)


def test_spaced_prefix_differs_piecewise_and_trains_the_merged_token() -> None:
    """The old piecewise path gives other ids than the template where the prefix's space
    merges with the answer; one pass trains that merged token (" a"), not the prefix."""
    tokenizer = _with_template(_byte_level(), SPACED)
    conv = parse_conversation(CONVERSATIONS[-1])
    stock = template_ids(tokenizer, conv.to_messages(), generation=False)
    piecewise = _train(conv, tokenizer, SPACED, piecewise=True)
    image_id = {tokenizer.convert_tokens_to_ids(IMAGE)}
    message = r"differ from the rendered string's at token \d+ .*tokens \["
    with pytest.raises(AssertionError, match=message):
        assert_one_pass("piecewise", piecewise.input_ids, stock, tokenizer, image_id)
    out = _train(conv, tokenizer, SPACED)
    targets = [t for t, label in zip(out.input_ids[1:], out.labels) if label != IGNORE_INDEX]
    first = tokenizer.convert_ids_to_tokens(targets[:2])
    assert first == ["Ġa", "Ġsquare"], first
    assert tokenizer.decode(targets).startswith(" a square" + END)
    # nothing of a user turn or a prefix alone is trained
    assert "User" not in tokenizer.decode(targets) and "Assistant" not in tokenizer.decode(targets)


def test_chatml_ids_and_labels_equal_piecewise() -> None:
    """Where special tokens sit at every boundary (ChatML) the ids and labels are unchanged."""
    tokenizer = _byte_level()
    for sample in CONVERSATIONS:
        conv = parse_conversation(sample)
        one = _train(conv, tokenizer, QWEN_CHATML)
        old = _train(conv, tokenizer, QWEN_CHATML, piecewise=True)
        assert one == old


def test_slow_tokenizer_falls_back_to_piecewise_with_a_warning() -> None:
    class Slow:
        """A tokenizer without offsets (``is_fast`` False)."""

        is_fast = False

        def __init__(self, inner) -> None:
            self.inner = inner

        def encode(self, text: str, **kwargs) -> list[int]:
            return self.inner.encode(text, **kwargs)

    fast = _byte_level()
    conv = parse_conversation(CONVERSATIONS[0])
    with pytest.warns(PiecewiseTokensWarning, match="no offsets"):
        slow = tokenize_conversation(conv, Slow(fast), SPACED, max_seq_len=None)
    assert slow == tokenize_conversation(conv, fast, SPACED, max_seq_len=None, piecewise=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        tokenize_conversation(conv, fast, SPACED, max_seq_len=None)  # fast: no warning


def test_placeholder_that_merges_with_text_is_rejected() -> None:
    tokenizer = _byte_level()
    conv = parse_conversation(
        {
            "images": ["a.png"],
            "messages": [
                {"role": "user", "content": "ab <image>"},
                {"role": "assistant", "content": "ok"},
            ],
        }
    )
    with pytest.raises(SampleError) as info:
        tokenize_conversation(
            conv,
            tokenizer,
            QWEN_CHATML,
            image_tokens=lambda i, p: [5],
            image_placeholder="cd",  # "ab cd": " c" spans the text's space and the placeholder
            max_seq_len=None,
        )
    assert info.value.reason == "image_token_mismatch" and "'cd'" in info.value.message


def test_describe_difference_shows_ids_and_token_strings() -> None:
    tokenizer = _byte_level()
    a = tokenizer.encode("Assistant: a square", add_special_tokens=False)
    b = tokenizer.encode("Assistant: ", add_special_tokens=False) + tokenizer.encode(
        "a square", add_special_tokens=False
    )
    text = describe_difference(b, a, tokenizer, ("training", "stock"))
    assert "'Ġ'" in text and "'Ġa'" in text  # repr'd token strings: the space shows
    assert (
        f"{tokenizer.convert_tokens_to_ids('Ġa')}]" in text
        or f"{tokenizer.convert_tokens_to_ids('Ġa')}," in text
    )
    assert describe_difference(a, a, tokenizer, ("x", "y")) == ""
