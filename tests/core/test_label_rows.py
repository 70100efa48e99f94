"""The last decoder layer at label rows only (``hyper_core.step.label_rows``): the same loss
and gradients as the whole layer, with activation checkpointing too; whole modules when a
forward has no row mask; a clear error for a module that is not per token."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from hyper_core.step.label_positions import keep_label_positions
from hyper_core.step.label_rows import LabelRows, install_label_rows
from hyper_core.testing.conformance import AdapterUnderTest


@pytest.fixture(scope="module")
def text(tmp_path_factory: pytest.TempPathFactory) -> AdapterUnderTest:
    return AdapterUnderTest(
        "hf_causal_lm", "tiny-qwen2", None, workdir=tmp_path_factory.mktemp("label-rows")
    )


def _loss_and_grads(t: AdapterUnderTest, model: Any, mb: Any) -> tuple[float, dict[str, Any]]:
    model.zero_grad(set_to_none=True)
    loss = t.loss(model, mb)
    loss.backward()
    return loss.item(), {n: p.grad.clone() for n, p in model.named_parameters()}


@pytest.mark.parametrize("checkpointing", [False, True])
def test_label_rows_give_the_whole_layers_loss_and_gradients(
    text: AdapterUnderTest, checkpointing: bool
) -> None:
    torch.manual_seed(0)
    model = text.build_model()
    model.train()
    if checkpointing:  # backward recomputes the last layer: on the same rows
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    mb = keep_label_positions(text.micro_batch("packed"))
    assert 0 < int(mb.loss_inputs["label_mask"].sum()) < mb.loss_inputs["label_mask"].numel()
    full, full_grads = _loss_and_grads(text, model, mb)

    names = text.adapter.label_row_modules(model)
    assert names[-1].endswith(".mlp") and ".layers.1." in names[-1]  # the last of 2 layers
    seen: dict[str, torch.Size] = {}
    mlp = model.get_submodule(names[-1])
    mlp.down_proj.register_forward_hook(lambda m, i, o: seen.__setitem__("down", i[0].shape))
    install_label_rows(model, names)
    rows, grads = _loss_and_grads(text, model, mb)

    assert seen["down"][1] == int(mb.loss_inputs["label_mask"].sum())  # label rows only
    assert rows == pytest.approx(full, abs=1e-5)
    for n, g in full_grads.items():
        assert torch.allclose(grads[n], g, atol=1e-5, rtol=1e-4), n


def test_a_forward_without_a_row_mask_runs_the_modules_whole(text: AdapterUnderTest) -> None:
    model = text.build_model()
    model.eval()
    mb = text.micro_batch("packed")
    with torch.no_grad():
        before = model(**mb.model_inputs, use_cache=False).logits
        install_label_rows(model, text.adapter.label_row_modules(model))
        model(**keep_label_positions(mb).model_inputs, use_cache=False)  # a masked forward...
        after = model(**mb.model_inputs, use_cache=False).logits  # ...then a whole one
    assert torch.equal(before, after)


def test_nothing_is_installed_without_modules(text: AdapterUnderTest) -> None:
    model = text.build_model()
    assert install_label_rows(model, []) is None
    assert not model._forward_pre_hooks


def test_a_module_that_changes_the_row_count_is_refused() -> None:
    rows = LabelRows()
    mask = torch.tensor([[True, False, True]])
    rows.capture(torch.nn.Identity(), (), {"logits_to_keep": mask})
    x = torch.randn(1, 3, 4)
    out = rows.run(lambda h: h * 2, x)
    assert torch.equal(out[0, [0, 2]], x[0, [0, 2]] * 2) and not out[0, 1].any()
    with pytest.raises(TypeError, match="label_row_modules"):
        rows.run(lambda h: h.sum(dim=1, keepdim=True), x)
    # another shape (a vision tower's rows): the whole module
    assert torch.equal(rows.run(lambda h: h + 1, torch.zeros(1, 5, 4)), torch.ones(1, 5, 4))
    rows.capture(torch.nn.Identity(), (), {"logits_to_keep": 1})
    assert rows.mask is None and torch.equal(rows.run(lambda h: h + 1, x), x + 1)


def test_adapters_name_the_last_decoder_layer_and_skip_moe_blocks(tmp_path: Path) -> None:
    moe = AdapterUnderTest("qwen3_vl_moe", "tiny", None, workdir=tmp_path)
    model = moe.build_model()
    names = moe.adapter.label_row_modules(model)
    last = max(int(n.split(".")[3]) for n, _ in model.named_modules() if ".layers." in n)
    assert names and all(n.startswith(f"model.language_model.layers.{last}.") for n in names)
    assert not any(n.endswith(".mlp") for n in names)  # the MoE block: router statistics
