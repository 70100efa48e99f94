"""materialize(): a meta-built model, allocated and loaded from a state dict, is the built model."""

from __future__ import annotations

import torch

from hyper_core.builtin.hf_causal_lm import HFCausalLMAdapter
from hyper_core.config import ModelConfig
from hyper_core.parallel.materialize import init_non_persistent_buffers, materialize


def non_persistent_buffers(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {
        f"{prefix}.{name}" if prefix else name: module._buffers[name]
        for prefix, module in model.named_modules()
        for name in module._non_persistent_buffers_set
        if module._buffers.get(name) is not None
    }


def test_meta_build_materialize_load_gives_the_rotary_buffers_of_a_normal_build() -> None:
    adapter = HFCausalLMAdapter()
    config = ModelConfig(adapter="hf_causal_lm", config="tiny-qwen2")
    built = adapter.build_model(config)
    model = adapter.build_model(config, device="meta")
    materialize(model, "cpu")
    model.load_state_dict(built.state_dict())
    expected = non_persistent_buffers(built)
    assert any(name.endswith("inv_freq") for name in expected)
    got = non_persistent_buffers(model)
    assert got.keys() == expected.keys()
    for name, buf in expected.items():
        assert torch.equal(got[name], buf), name
    ids = torch.tensor([[1, 2, 3, 4]])
    torch.testing.assert_close(model(input_ids=ids).logits, built(input_ids=ids).logits)


def test_a_plain_module_without_hf_init_is_reported_uncovered() -> None:
    class Rotary(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.register_buffer("inv_freq", torch.ones(2), persistent=False)

    model = torch.nn.Sequential(torch.nn.Linear(2, 2), Rotary())
    assert init_non_persistent_buffers(model) == ["1"]
