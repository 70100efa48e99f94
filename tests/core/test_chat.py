"""Chat rendering: token ids, shifted labels on assistant turns, image spans, HF template."""

from __future__ import annotations

import pytest

from hyper_core.batching.types import IGNORE_INDEX
from hyper_core.data.chat import (
    QWEN_CHATML,
    QWEN_CHATML_TEMPLATE,
    ChatFormat,
    tokenize_conversation,
    tokenize_prompt,
)
from hyper_core.data.conversation import Conversation, ImagePart, parse_conversation
from hyper_core.data.errors import SampleError
from hyper_core.data.tokenizer import CHATML_SPECIAL_TOKENS, build_offline_tokenizer

VISION = ("<|vision_start|>", "<|image_pad|>", "<|vision_end|>")


@pytest.fixture(scope="module")
def tok():
    return build_offline_tokenizer(
        special_tokens=[*CHATML_SPECIAL_TOKENS, *VISION], chat_template=QWEN_CHATML_TEMPLATE
    )


def _conv(*turns: tuple[str, str]) -> Conversation:
    return parse_conversation({"messages": [{"role": r, "content": c} for r, c in turns]})


def _targets(tok, result) -> list[str]:
    """The decoded target tokens, one string per maximal run of loss positions."""
    runs, current = [], []
    for i, label in enumerate(result.labels):
        if label != IGNORE_INDEX:
            assert label == result.input_ids[i + 1], "labels must be shifted input ids"
            current.append(label)
        elif current:
            runs.append(tok.decode(current))
            current = []
    if current:
        runs.append(tok.decode(current))
    return runs


def test_loss_only_on_assistant_content_and_end_token(tok) -> None:
    conv = _conv(
        ("user", "What colour is the sky?"),
        ("assistant", "blue"),
        ("user", "And grass?"),
        ("assistant", "green"),
    )
    out = tokenize_conversation(conv, tok, QWEN_CHATML, max_seq_len=512)
    assert _targets(tok, out) == ["blue<|im_end|>", "green<|im_end|>"]
    assert out.labels[-1] == IGNORE_INDEX
    assert out.num_loss_tokens == sum(label != IGNORE_INDEX for label in out.labels)
    assert tok.decode(out.input_ids) == QWEN_CHATML.render(conv)
    # the newline after <|im_end|> is never a target
    im_end = tok.convert_tokens_to_ids("<|im_end|>")
    for i, t in enumerate(out.input_ids[:-1]):
        if t == im_end:
            assert out.labels[i] == IGNORE_INDEX


def test_matches_hf_apply_chat_template(tok) -> None:
    cases = [
        [("user", "Reverse: abc"), ("assistant", "cba")],
        [("system", "Be short."), ("user", " hi there"), ("assistant", "Hello!\nBye")],
        [("user", "a"), ("assistant", "b"), ("user", "c"), ("assistant", "d")],
    ]
    for turns in cases:
        conv = _conv(*turns)
        messages = conv.to_messages()
        text = tok.apply_chat_template(messages, tokenize=False)
        assert text == QWEN_CHATML.render(conv)
        hf_ids = tok(text, add_special_tokens=False)["input_ids"]
        assert hf_ids == tokenize_conversation(conv, tok, QWEN_CHATML, max_seq_len=None).input_ids
        prompt, _ = conv.prompt_and_answer()
        gen_text = tok.apply_chat_template(
            prompt.to_messages(), tokenize=False, add_generation_prompt=True
        )
        assert gen_text == QWEN_CHATML.render(prompt, add_generation_prompt=True)
        assert gen_text.endswith("<|im_start|>assistant\n")
        prompt_ids = tokenize_prompt(prompt, tok, QWEN_CHATML).input_ids
        assert prompt_ids == tok(gen_text, add_special_tokens=False)["input_ids"]


def test_default_system_inserted_only_without_system(tok) -> None:
    with_default = QWEN_CHATML.render(_conv(("user", "x"), ("assistant", "y")))
    assert with_default.startswith("<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n")
    own = QWEN_CHATML.render(_conv(("system", "S"), ("user", "x"), ("assistant", "y")))
    assert own.startswith("<|im_start|>system\nS<|im_end|>\n") and "helpful" not in own


def test_image_tokens_spans_and_no_loss(tok) -> None:
    vs, pad, ve = (tok.convert_tokens_to_ids(t) for t in VISION)
    conv = parse_conversation(
        {
            "images": ["a.png", "b.png"],
            "messages": [
                {"role": "user", "content": "<image>first <image>second"},
                {"role": "assistant", "content": "ok"},
            ],
        }
    )
    calls = []

    def image_tokens(index: int, part: ImagePart) -> list[int]:
        calls.append((index, part.path.name))
        return [vs] + [pad] * (index + 2) + [ve]

    out = tokenize_conversation(
        conv,
        tok,
        QWEN_CHATML,
        image_tokens=image_tokens,
        image_placeholder="".join(VISION),
        max_seq_len=512,
    )
    assert calls == [(0, "a.png"), (1, "b.png")]
    assert len(out.image_spans) == 2
    for k, (start, end) in enumerate(out.image_spans):
        assert out.input_ids[start:end] == [vs] + [pad] * (k + 2) + [ve]
        # no position inside an image (nor the one before it) has a target
        assert all(label == IGNORE_INDEX for label in out.labels[start - 1 : end])
    assert _targets(tok, out) == ["ok<|im_end|>"]
    with pytest.raises(SampleError) as info:
        tokenize_conversation(conv, tok, QWEN_CHATML, max_seq_len=512)
    assert info.value.reason == "bad_format"


def test_too_long_never_truncates(tok) -> None:
    conv = _conv(("user", "word " * 50), ("assistant", "done"))
    n = tokenize_conversation(conv, tok, QWEN_CHATML, max_seq_len=None).length
    assert tokenize_conversation(conv, tok, QWEN_CHATML, max_seq_len=n).length == n
    with pytest.raises(SampleError) as info:
        tokenize_conversation(conv, tok, QWEN_CHATML, max_seq_len=n - 1)
    assert info.value.reason == "too_long" and str(n) in info.value.message


def test_no_loss_tokens() -> None:
    plain = ChatFormat(message_prefix="{role}: ", message_suffix="\n")
    tok = build_offline_tokenizer(special_tokens=CHATML_SPECIAL_TOKENS)
    out = tokenize_conversation(
        _conv(("user", "q"), ("assistant", "a")), tok, plain, max_seq_len=64
    )
    # one pass: the prefix's space merges into the answer's first token, which is trained
    assert _targets(tok, out) == [" a"]
    with pytest.raises(SampleError) as info:
        tokenize_conversation(_conv(("user", "q"), ("assistant", "")), tok, plain, max_seq_len=64)
    assert info.value.reason == "no_loss_tokens"


def test_bos_and_custom_prefix_template(tok) -> None:
    fmt = ChatFormat(
        message_prefix="<|im_start|>[{role}]: ", message_suffix="<|im_end|>", bos="<|endoftext|>"
    )
    conv = _conv(("user", 'say "hi"\\n'), ("assistant", "hi"))
    tok2 = build_offline_tokenizer(
        special_tokens=CHATML_SPECIAL_TOKENS, chat_template=fmt.chat_template
    )
    assert tok2.apply_chat_template(conv.to_messages(), tokenize=False) == fmt.render(conv)
    out = tokenize_conversation(conv, tok2, fmt, max_seq_len=128)
    assert out.input_ids[0] == tok2.convert_tokens_to_ids("<|endoftext|>")
    assert _targets(tok2, out) == [" hi<|im_end|>"]  # "]: " + "hi": the space merges


def test_text_chat_transform_builds_features(tok) -> None:
    import pickle

    from hyper_core.data.chat import TextChatTransform

    transform = TextChatTransform(tok, QWEN_CHATML, max_seq_len=128)
    sample = {
        "prompt": "What comes after c?",
        "completion": "d",
        "meta": {"task": "next_letter"},
        "_source": {"file": "/x.jsonl", "line": 1},
    }
    features = transform(sample)
    assert features.input_ids.dtype == features.labels.dtype
    assert features.input_ids.dtype.is_floating_point is False
    assert features.meta == {"task": "next_letter"}
    assert tok.decode(features.labels[features.labels != IGNORE_INDEX]) == "d<|im_end|>"
    again = pickle.loads(pickle.dumps(transform))(sample)
    assert again.input_ids.tolist() == features.input_ids.tolist()
    with pytest.raises(SampleError, match="too_long"):
        TextChatTransform(tok, QWEN_CHATML, max_seq_len=4)(sample)


def test_piece_cache_follows_the_tokenizer() -> None:
    """Repeated pieces come from the cache, and a tokenizer that gains tokens is re-asked
    (the piecewise path, the slow-tokenizer fallback)."""
    tok = build_offline_tokenizer(
        special_tokens=list(CHATML_SPECIAL_TOKENS), chat_template=QWEN_CHATML_TEMPLATE
    )
    calls = []
    encode = tok.encode

    def counting_encode(text, **kwargs):
        calls.append(text)
        return encode(text, **kwargs)

    tok.encode = counting_encode
    conv = _conv(("user", "What colour is <|box|> the shape?"), ("assistant", "red"))
    first = tokenize_conversation(conv, tok, QWEN_CHATML, max_seq_len=None, piecewise=True)
    n_first = len(calls)
    again = tokenize_conversation(conv, tok, QWEN_CHATML, max_seq_len=None, piecewise=True)
    assert n_first > 0 and len(calls) == n_first  # every piece served from the cache
    assert again == first
    tok.add_special_tokens({"additional_special_tokens": ["<|box|>"]})
    added = tokenize_conversation(conv, tok, QWEN_CHATML, max_seq_len=None, piecewise=True)
    assert len(calls) > n_first
    assert tok.convert_tokens_to_ids("<|box|>") in added.input_ids
    assert tok.convert_tokens_to_ids("<|box|>") not in first.input_ids
