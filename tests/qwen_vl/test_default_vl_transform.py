"""``HFModelAdapter``'s default VL transform: an adapter that sets ``chat_format`` gets it, and
``sample_fields`` adds what is model-specific (Qwen-VL's mRoPE positions)."""

from __future__ import annotations

from typing import Any, ClassVar

import pytest
import torch
from qwen_vl_helpers import cached_assets

from hyper_core.adapters.base import ModelAssets
from hyper_core.adapters.hf import HFModelAdapter
from hyper_core.data.chat import QWEN_CHATML, ChatFormat
from hyper_core.data.errors import SampleError
from hyper_core.data.multimodal import MultimodalTokens
from hyper_qwen_vl.adapters import Qwen2VLAdapter


class PlainVL(HFModelAdapter):
    """A VL adapter that declares only its chat format."""

    name = "plain_vl"
    chat_format: ClassVar[ChatFormat | None] = QWEN_CHATML


class Tagged(PlainVL):
    """Adds a token field through ``sample_fields``."""

    def sample_fields(self, tokens: MultimodalTokens, assets: ModelAssets) -> dict[str, Any]:
        return {"token_fields": {"is_image": tokens.is_image.long()}}


def test_default_transform_is_the_core_multimodal_transform(
    samples: list[dict[str, Any]],
) -> None:
    assets = cached_assets("qwen2_vl")
    qwen = Qwen2VLAdapter()
    for sample in samples:
        plain = PlainVL().transform(sample, assets, max_seq_len=1024)
        full = qwen.transform(sample, assets, max_seq_len=1024)
        assert torch.equal(plain.input_ids, full.input_ids)
        assert torch.equal(plain.labels, full.labels)
        assert plain.media.keys() == full.media.keys()
        for key in full.media:
            assert torch.equal(plain.media[key], full.media[key])
        assert plain.num_images == full.num_images and plain.meta == full.meta
        # what is Qwen-specific comes only from its sample_fields
        assert plain.position_ids is None and plain.token_fields == {}
        assert full.position_ids.shape == (4, full.length)
        tagged = Tagged().transform(sample, assets, max_seq_len=1024)
        assert torch.equal(tagged.token_fields["is_image"], full.token_fields["mm_token_type_ids"])


def test_default_transform_raises_sample_errors(samples: list[dict[str, Any]]) -> None:
    with pytest.raises(SampleError) as err:
        PlainVL().transform(samples[1], cached_assets("qwen2_vl"), max_seq_len=8)
    assert err.value.reason == "too_long"


def test_adapter_without_chat_format_says_what_to_do() -> None:
    class Bare(HFModelAdapter):
        name = "bare"

    with pytest.raises(NotImplementedError, match="set chat_format"):
        Bare().transform({"messages": []}, cached_assets("qwen2_vl"), max_seq_len=8)
