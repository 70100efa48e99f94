"""``ModelAdapter`` is the required API; the vision encoder and MoE blocks are optional
capabilities (runtime-checkable protocols) that the features needing them check for."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest
import torch

from hyper_core.adapters.base import (
    ModelAdapter,
    MoEAdapter,
    MoEBlock,
    ParallelPlan,
    VisionEncoderAdapter,
    VisionEncoderSpec,
)
from hyper_core.adapters.vision_context import VisionContext
from hyper_core.config.schema import ModelConfig
from hyper_core.errors import ConfigError


class TextOnly(ModelAdapter):
    name = "text_only"


class DeclaresEncoderOnly(ModelAdapter):
    """Declares a vision encoder in its plan but implements none of the capability."""

    name = "declares_only"

    def parallel_plan(self, model: torch.nn.Module) -> ParallelPlan:
        return ParallelPlan(sharding_units=(), vision_encoder=VisionEncoderSpec(module="visual"))


class WithEncoder(DeclaresEncoderOnly):
    name = "with_encoder"

    def split_vision_inputs(
        self, model_inputs: Mapping[str, Any], context: VisionContext
    ) -> list[dict[str, Any]]:
        return []

    def call_vision_encoder(
        self, model: torch.nn.Module, vision_inputs: Mapping[str, Any], context: VisionContext
    ) -> Any:
        return None

    def inject_vision_outputs(
        self, model_inputs: Mapping[str, Any], outputs: Any, context: VisionContext
    ) -> dict[str, Any]:
        return dict(model_inputs)


def test_the_base_adapter_has_no_optional_capability() -> None:
    assert not isinstance(TextOnly(), VisionEncoderAdapter)
    assert not isinstance(TextOnly(), MoEAdapter)
    assert isinstance(WithEncoder(), VisionEncoderAdapter)


def test_encoder_parallel_names_the_missing_capability_methods() -> None:
    from hyper_encoder_parallel.run import check_vision_encoder

    adapter = DeclaresEncoderOnly()
    with pytest.raises(ConfigError) as info:
        check_vision_encoder(adapter, adapter.parallel_plan(torch.nn.Module()), "$.x")
    text = str(info.value)
    assert "$.x" in text and "does not implement" in text
    assert "split_vision_inputs and call_vision_encoder and inject_vision_outputs" in text
    adapter = WithEncoder()
    check_vision_encoder(adapter, adapter.parallel_plan(torch.nn.Module()), "$.x")  # no error


def _tiny(adapter: ModelAdapter) -> torch.nn.Module:
    torch.manual_seed(0)
    return adapter.build_model(ModelConfig(adapter=adapter.name, config="tiny"))


def test_qwen3_vl_moe_lists_its_moe_blocks() -> None:
    from hyper_qwen_vl.adapters import Qwen3VLMoeAdapter

    adapter = Qwen3VLMoeAdapter()
    assert isinstance(adapter, MoEAdapter) and isinstance(adapter, VisionEncoderAdapter)
    model = _tiny(adapter)
    text = model.config.text_config
    blocks = adapter.moe_blocks(model)
    assert blocks == [
        MoEBlock(
            module=f"model.language_model.layers.{i}.mlp",
            experts=f"model.language_model.layers.{i}.mlp.experts",
            router=f"model.language_model.layers.{i}.mlp.gate",
            num_experts=text.num_experts,
            top_k=text.num_experts_per_tok,
        )
        for i in range(text.num_hidden_layers)
    ]
    for block in blocks:  # the paths resolve in the model
        assert model.get_submodule(block.router).top_k == block.top_k
        model.get_submodule(block.experts)


def test_kimi_lists_its_sparse_layers_with_shared_experts() -> None:
    from hyper_kimi_k26.adapter import KimiK25Adapter

    adapter = KimiK25Adapter()
    assert isinstance(adapter, MoEAdapter)
    model = _tiny(adapter)
    text = model.config.text_config
    blocks = adapter.moe_blocks(model)
    sparse = range(text.first_k_dense_replace, text.num_hidden_layers)
    assert [b.module for b in blocks] == [f"model.language_model.layers.{i}.mlp" for i in sparse]
    assert len(blocks) >= 1
    for block in blocks:
        assert block.num_experts == text.n_routed_experts
        assert block.top_k == text.num_experts_per_tok
        assert block.shared_experts == f"{block.module}.shared_experts"
        model.get_submodule(block.shared_experts)
        model.get_submodule(block.experts)


def test_dense_adapters_have_no_moe_capability() -> None:
    from hyper_core.builtin.hf_causal_lm import HFCausalLMAdapter
    from hyper_qwen_vl.adapters import Qwen3VLAdapter

    assert not isinstance(Qwen3VLAdapter(), MoEAdapter)
    assert not isinstance(HFCausalLMAdapter(), MoEAdapter)
