"""The export serves stock transformers (``AutoProcessor`` + ``generate``): the conformance
check passes for the example (``TestLlavaConformance.test_stock_inference``) and fails for
exports that lack what the stock ``LlavaProcessor`` needs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hyper_llava.adapter import LlavaAdapter
from hyper_llava.tokens import CHAT_FORMAT

from hyper_core.hookspecs import hookimpl
from hyper_core.testing.conformance import (
    AdapterUnderTest,
    NotApplicable,
    check_stock_inference,
)


class NoProcessorConfig(LlavaAdapter):
    """Exports no ``processor_config.json``: ``LlavaProcessor`` gets ``patch_size=None``."""

    def build_assets(self, model_config: Any) -> Any:
        assets = super().build_assets(model_config)
        assets.processor.processor_class = None
        return assets


class TextOnlyTemplate(LlavaAdapter):
    """Saves a chat template that leaves image parts out."""

    def build_assets(self, model_config: Any) -> Any:
        assets = super().build_assets(model_config)
        assets.tokenizer.chat_template = CHAT_FORMAT.chat_template
        return assets


class OtherPrompt(LlavaAdapter):
    """Saves a template whose prompt differs from training's (no newline after the role)."""

    def build_assets(self, model_config: Any) -> Any:
        from hyper_core.data.chat import ChatFormat

        assets = super().build_assets(model_config)
        other = ChatFormat(message_prefix="<|im_start|>{role}", message_suffix="<|im_end|>\n")
        assets.tokenizer.chat_template = other.template(image="<image>")
        return assets


BROKEN = {
    "no_processor_config": (NoProcessorConfig, "unsupported operand type"),
    "text_only_template": (TextOnlyTemplate, "0 <image> tokens"),
    "other_prompt": (OtherPrompt, "the conversation: stock ids differ from training's"),
}


class Broken:
    @hookimpl
    def register_model_adapters(self, register: Any) -> None:
        for name, (cls, _) in BROKEN.items():
            register(name, cls)


@pytest.mark.parametrize("name", list(BROKEN))
def test_the_check_fails_an_export_stock_transformers_cannot_use(name: str, tmp_path: Path) -> None:
    subject = AdapterUnderTest(name, plugins=[Broken()], workdir=tmp_path)
    with pytest.raises(Exception, match=BROKEN[name][1]):
        check_stock_inference(subject)


def test_without_a_stock_processor_the_check_says_not_applicable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As for a model type transformers has no processor for: AutoProcessor falls back to the
    tokenizer, and the export names no processor class."""
    from transformers import AutoProcessor, AutoTokenizer

    def tokenizer_only(path: str, **kwargs: Any) -> Any:
        return AutoTokenizer.from_pretrained(path, **kwargs)

    monkeypatch.setattr(AutoProcessor, "from_pretrained", tokenizer_only)
    subject = AdapterUnderTest("no_processor_config", plugins=[Broken()], workdir=tmp_path)
    with pytest.raises(NotApplicable, match="no processor for model type 'llava'"):
        check_stock_inference(subject)
    named = AdapterUnderTest("llava", plugins=[Broken(), "hyper_llava.plugin"], workdir=tmp_path)
    with pytest.raises(AssertionError, match=r"not the processor that processor_config\.json"):
        check_stock_inference(named)
