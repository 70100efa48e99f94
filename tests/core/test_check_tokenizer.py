"""check_tokenizer (HF adapter base): the config's special-token ids are the tokenizer's."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from hyper_core.adapters.hf import check_tokenizer
from hyper_core.errors import UserError

FIELDS = {"image_token_id": "<image>"}


class Tokenizer:
    def __init__(self, vocab: dict[str, int]) -> None:
        self.vocab = vocab

    def get_vocab(self) -> dict[str, int]:
        return self.vocab


def hf_config(image_token_id: int | None, vocab_size: int = 10) -> SimpleNamespace:
    return SimpleNamespace(
        image_token_id=image_token_id, text_config=SimpleNamespace(vocab_size=vocab_size)
    )


def test_matching_ids_pass() -> None:
    check_tokenizer(hf_config(5), Tokenizer({"a": 0, "<image>": 5}), "/m", FIELDS)
    check_tokenizer(hf_config(None), Tokenizer({"<image>": 5}), "/m", FIELDS)


def test_a_mismatched_id_names_the_field_and_the_tokenizer() -> None:
    with pytest.raises(UserError) as info:
        check_tokenizer(hf_config(4), Tokenizer({"<image>": 5}), "/m", FIELDS)
    assert str(info.value) == (
        "$.model: config image_token_id = 4 but the tokenizer of /m maps <image> to 5"
    )
    with pytest.raises(UserError, match=r"offline demo tokenizer .*add them"):
        check_tokenizer(hf_config(4), Tokenizer({"<image>": 5}), None, FIELDS)


def test_ids_beyond_the_vocab_size() -> None:
    with pytest.raises(UserError, match="has ids up to 12 but the model's vocab_size is 10"):
        check_tokenizer(hf_config(None), Tokenizer({"x": 12}), "/m", FIELDS)
