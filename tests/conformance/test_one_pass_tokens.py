"""A text adapter whose role prefixes end in a space: its one-pass ids are the saved
template's (``one_pass_tokens`` and ``stock_inference`` pass); tokenised piece by piece (as
before one-pass tokenising) it fails both, and the messages show the differing ids."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from hyper_core import hookimpl
from hyper_core.adapters.base import ModelAssets
from hyper_core.batching.types import SampleFeatures
from hyper_core.builtin.hf_causal_lm import HFCausalLMAdapter
from hyper_core.data.chat import ChatFormat, to_features, tokenize_conversation
from hyper_core.data.conversation import parse_conversation
from hyper_core.testing.conformance import AdapterUnderTest
from hyper_core.testing.conformance_inference import check_stock_inference
from hyper_core.testing.conformance_tokens import check_one_pass_tokens

#: ``User: …<|im_end|>\nAssistant: …<|im_end|>\n``: no special token after the prefixes.
SPACED = ChatFormat(
    message_prefix="{role}: ",
    message_suffix="<|im_end|>\n",
    role_prefixes={"user": "User: ", "assistant": "Assistant: "},
)


class SpacedPrefix(HFCausalLMAdapter):
    chat_format = SPACED


class SpacedPiecewise(SpacedPrefix):
    """The same adapter tokenised piece by piece (the path before one-pass tokenising)."""

    def transform(
        self, sample: Mapping[str, Any], assets: ModelAssets, *, max_seq_len: int
    ) -> SampleFeatures:
        conv = parse_conversation(sample)
        tokenized = tokenize_conversation(
            conv, assets.tokenizer, self.chat_format, max_seq_len=max_seq_len, piecewise=True
        )
        return to_features(tokenized)


class SpacedAdapters:
    @hookimpl
    def register_model_adapters(self, register: Any) -> None:
        register("spaced_prefix", SpacedPrefix)
        register("spaced_piecewise", SpacedPiecewise)


def _subject(name: str, tmp_path: Path) -> AdapterUnderTest:
    return AdapterUnderTest(name, "tiny-qwen2", plugins=[SpacedAdapters()], workdir=tmp_path)


def test_spaced_prefix_adapter_trains_on_the_templates_ids(tmp_path: Path) -> None:
    subject = _subject("spaced_prefix", tmp_path)
    assert subject.assets.tokenizer.chat_template == SPACED.chat_template
    check_one_pass_tokens(subject)
    check_stock_inference(subject)


def test_piecewise_ids_fail_both_checks_showing_the_ids(tmp_path: Path) -> None:
    subject = _subject("spaced_piecewise", tmp_path)
    with pytest.raises(AssertionError, match=r"at token \d+.*ids \[.*tokens \[.*'Ġ") as info:
        check_one_pass_tokens(subject)
    assert "training ids differ from the rendered string's" in str(info.value)
    stock = r"stock ids differ from training's at token \d+.*ids \[.*tokens \["
    with pytest.raises(AssertionError, match=stock):
        check_stock_inference(subject)
