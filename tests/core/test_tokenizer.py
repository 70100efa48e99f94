"""The offline byte-level BPE tokenizer."""

from __future__ import annotations

import hashlib
import subprocess
import sys
from pathlib import Path

import pytest

from hyper_core.data.chat import QWEN_CHATML_TEMPLATE
from hyper_core.data.tokenizer import (
    CHATML_SPECIAL_TOKENS,
    _trained_json,
    build_offline_tokenizer,
    special_token_ids,
    tokenizer_json,
)

SPECIALS = [*CHATML_SPECIAL_TOKENS, "<|image_pad|>"]


def test_special_tokens_have_fixed_leading_ids() -> None:
    tok = build_offline_tokenizer(special_tokens=SPECIALS)
    expected = {"<|endoftext|>": 0, "<|im_end|>": 1, "<|im_start|>": 2, "<|image_pad|>": 3}
    assert special_token_ids(tok, list(expected)) == expected
    other = build_offline_tokenizer(special_tokens=SPECIALS, vocab_size=400, corpus=["zzz zzz"])
    assert special_token_ids(other, list(expected)) == expected
    assert tok.pad_token_id == 0 and tok.eos_token_id == 1
    assert set(expected) <= set(tok.all_special_tokens)
    with pytest.raises(KeyError, match="nope"):
        special_token_ids(tok, ["<|nope|>"])


def test_any_text_roundtrips_and_specials_are_atomic() -> None:
    tok = build_offline_tokenizer(special_tokens=SPECIALS)
    for text in [
        "Describe the image.",
        "héllo wörld 😀 ½ \t\n x",
        "<|im_start|>user\nhi<|im_end|>",
    ]:
        ids = tok.encode(text, add_special_tokens=False)
        assert tok.decode(ids) == text
    ids = tok.encode("a<|image_pad|><|image_pad|>b", add_special_tokens=False)
    assert ids.count(3) == 2 and len(ids) == 4
    assert tok.decode(ids, skip_special_tokens=True) == "ab"
    assert len(tok) <= 512


def test_corpus_words_become_single_tokens() -> None:
    word = "xylophonequartz"
    base = build_offline_tokenizer(special_tokens=SPECIALS)
    assert len(base.tokenize(" " + word)) > 1
    tuned = build_offline_tokenizer(special_tokens=SPECIALS, corpus=[f"play the {word}"] * 50)
    assert tuned.tokenize(" " + word) == ["Ġ" + word]


def test_deterministic_in_process_and_across_processes() -> None:
    first = tokenizer_json(special_tokens=SPECIALS, corpus=["a b c", "the cat"])
    _trained_json.cache_clear()
    again = tokenizer_json(special_tokens=SPECIALS, corpus=["a b c", "the cat"])
    assert first == again
    code = (
        "import hashlib; from hyper_core.data.tokenizer import tokenizer_json;"
        f"print(hashlib.sha256(tokenizer_json(special_tokens={SPECIALS!r},"
        " corpus=['a b c', 'the cat']).encode()).hexdigest())"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert proc.stdout.strip() == hashlib.sha256(first.encode()).hexdigest()


def test_each_call_returns_an_independent_tokenizer() -> None:
    a = build_offline_tokenizer(special_tokens=SPECIALS)
    a.padding_side = "left"
    b = build_offline_tokenizer(special_tokens=SPECIALS)
    assert b.padding_side == "right" and a is not b


def test_save_and_reload_offline(tmp_path: Path) -> None:
    from transformers import AutoTokenizer

    tok = build_offline_tokenizer(special_tokens=SPECIALS, chat_template=QWEN_CHATML_TEMPLATE)
    tok.save_pretrained(str(tmp_path))
    back = AutoTokenizer.from_pretrained(str(tmp_path), local_files_only=True)
    texts = ["What shape is it? a red circle", "<|im_start|>user\n😀<|image_pad|><|im_end|>\n"]
    for text in texts:
        assert back.encode(text, add_special_tokens=False) == tok.encode(
            text, add_special_tokens=False
        )
    assert back.get_vocab() == tok.get_vocab()
    assert (back.pad_token_id, back.eos_token_id) == (tok.pad_token_id, tok.eos_token_id)
    assert back.chat_template == QWEN_CHATML_TEMPLATE
    messages = [{"role": "user", "content": "x"}, {"role": "assistant", "content": "y"}]
    assert back.apply_chat_template(messages, tokenize=False) == tok.apply_chat_template(
        messages, tokenize=False
    )


def test_vocab_too_small() -> None:
    with pytest.raises(ValueError, match="vocab_size"):
        build_offline_tokenizer(special_tokens=SPECIALS, vocab_size=100)


def test_named_special_tokens_are_attributes_as_stock_processors_read_them(
    tmp_path: Path,
) -> None:
    from transformers import AutoTokenizer

    named = {"boi_token": "<start_of_image>", "image_token": "<image_soft_token>"}
    tok = build_offline_tokenizer(
        special_tokens=["<start_of_turn>", "<image_soft_token>"],
        named_special_tokens=named,
        pad_token="<pad>",
        eos_token="<eos>",
    )
    # listed first, then the named ones not listed yet: ids follow that order
    order = ["<pad>", "<eos>", "<start_of_turn>", "<image_soft_token>", "<start_of_image>"]
    assert [tok.convert_tokens_to_ids(t) for t in order] == list(range(5))
    assert (tok.boi_token, tok.image_token, tok.image_token_id) == (*named.values(), 3)
    ids = tok("a<image_soft_token>b<start_of_image>", add_special_tokens=False).input_ids
    assert 3 in ids and 4 in ids  # never split
    tok.save_pretrained(tmp_path)
    loaded = AutoTokenizer.from_pretrained(tmp_path)
    assert (loaded.boi_token, loaded.image_token_id) == ("<start_of_image>", 3)
