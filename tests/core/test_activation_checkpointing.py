"""Activation-checkpointing policies (``hyper_core.parallel.checkpointing``): each gives the
losses and gradients of ``none``, recomputes what it says (forward calls per unit, bytes
saved for backward), keeps the state-dict keys; the config takes policy names and the old
booleans; :func:`recompute_fraction`."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import torch

from hyper_core.config.converter import converter
from hyper_core.config.schema import TrainingConfig
from hyper_core.errors import ConfigError
from hyper_core.parallel.checkpointing import (
    apply_activation_checkpointing,
    checkpointed_units,
    recompute_fraction,
    recompute_share,
    split_units,
    unit_policy,
)
from hyper_core.testing import run_tiny_training, tiny_text_config
from hyper_core.testing.conformance import AdapterUnderTest

POLICIES = ["full", "every_n", "selective"]


@pytest.fixture(scope="module")
def text(tmp_path_factory: pytest.TempPathFactory) -> AdapterUnderTest:
    return AdapterUnderTest(
        "hf_causal_lm", "tiny-qwen2", None, workdir=tmp_path_factory.mktemp("ac-text")
    )


@pytest.fixture(scope="module")
def vl(tmp_path_factory: pytest.TempPathFactory) -> AdapterUnderTest:
    return AdapterUnderTest(
        "qwen2_5_vl",
        "tiny",
        None,
        plugins=["hyper_qwen_vl.plugin"],
        workdir=tmp_path_factory.mktemp("ac-vl"),
    )


def _model(t: AdapterUnderTest, policy: str, vision: str | None = None, every: int = 2) -> Any:
    torch.manual_seed(0)
    model = t.build_model().float().train()
    if policy != "none" or vision:
        plan = t.adapter.parallel_plan(model)
        apply_activation_checkpointing(model, plan, policy, vision, every)  # type: ignore[arg-type]
    return model


def _loss_and_grads(t: AdapterUnderTest, model: Any, mb: Any) -> tuple[float, dict[str, Any]]:
    model.zero_grad(set_to_none=True)
    loss = t.loss(model, mb)
    loss.backward()
    return loss.item(), {
        n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None
    }


def _held_bytes(t: AdapterUnderTest, model: Any, mb: Any) -> int:
    """Bytes of the storages made during one forward that are still alive after it (what is
    kept for backward: saved tensors and selective checkpointing's cache alike)."""
    from torch.multiprocessing.reductions import StorageWeakRef
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_leaves

    made: dict[int, tuple[Any, int]] = {}

    class Record(TorchDispatchMode):
        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None):
            out = func(*args, **(kwargs or {}))
            for x in tree_leaves(out):
                if isinstance(x, torch.Tensor):
                    s = x.untyped_storage()
                    made[s._cdata] = (StorageWeakRef(s), s.nbytes())
            return out

    with Record():
        loss = t.loss(model, mb)
    held = sum(n for ref, n in made.values() if not ref.expired())
    loss.backward()
    return held


@pytest.mark.parametrize("policy", POLICIES)
def test_each_policy_gives_the_losses_and_gradients_of_none_on_text(
    text: AdapterUnderTest, policy: str
) -> None:
    mb = text.micro_batch("packed")
    base, base_grads = _loss_and_grads(text, _model(text, "none"), mb)
    loss, grads = _loss_and_grads(text, _model(text, policy, every=2), mb)
    assert loss == pytest.approx(base, abs=1e-6)
    assert grads.keys() == base_grads.keys()
    for n, g in base_grads.items():
        assert torch.allclose(grads[n], g, atol=1e-6, rtol=1e-5), n


@pytest.mark.parametrize(
    ("policy", "vision"),
    [("full", None), ("every_n", "selective"), ("selective", "full"), ("none", "every_n")],
)
def test_each_policy_gives_the_losses_and_gradients_of_none_on_qwen2_5_vl(
    vl: AdapterUnderTest, policy: str, vision: str | None
) -> None:
    mb = vl.micro_batch("packed")
    base, base_grads = _loss_and_grads(vl, _model(vl, "none"), mb)
    model = _model(vl, policy, vision)
    loss, grads = _loss_and_grads(vl, model, mb)
    assert any(".visual.blocks." in n and g.abs().sum() > 0 for n, g in grads.items())
    assert loss == pytest.approx(base, abs=1e-6)
    for n, g in base_grads.items():
        assert torch.allclose(grads[n], g, atol=1e-6, rtol=1e-5), n
    assert model.state_dict().keys() == _model(vl, "none").state_dict().keys()


@pytest.mark.parametrize(("policy", "vision"), [("selective", None), ("every_n", "selective")])
def test_moe_and_mla_units_keep_the_math(
    tmp_path_factory: pytest.TempPathFactory, policy: str, vision: str | None
) -> None:
    """Kimi K2.6 (MLA attention, MoE blocks, its own ViT): the same losses and gradients."""
    kimi = AdapterUnderTest(
        "kimi_k25",
        "tiny",
        None,
        plugins=["hyper_kimi_k26.plugin"],
        workdir=tmp_path_factory.mktemp("ac-kimi"),
    )
    mb = kimi.micro_batch("packed")
    base, base_grads = _loss_and_grads(kimi, _model(kimi, "none"), mb)
    loss, grads = _loss_and_grads(kimi, _model(kimi, policy, vision), mb)
    assert loss == pytest.approx(base, abs=1e-6)
    for n, g in base_grads.items():
        assert torch.allclose(grads[n], g, atol=1e-6, rtol=1e-5), n


def test_vision_and_decoder_units_take_their_own_policies(vl: AdapterUnderTest) -> None:
    model = _model(vl, "every_n", "selective", every=2)
    decoder, vision = split_units(model, vl.adapter.parallel_plan(model))
    assert decoder and vision and not set(decoder) & set(vision)
    assert all(".visual." in n for n in vision)
    assert [unit_policy(model.get_submodule(n)) for n in decoder] == [
        "full" if i % 2 == 0 else "none" for i in range(len(decoder))
    ]
    assert {unit_policy(model.get_submodule(n)) for n in vision} == {"selective"}


@pytest.mark.parametrize(
    ("policy", "expected"),
    [("none", [1, 1]), ("full", [2, 2]), ("every_n", [2, 1]), ("selective", [2, 2])],
)
def test_the_chosen_units_run_forward_again_in_backward(
    text: AdapterUnderTest, policy: str, expected: list[int]
) -> None:
    model = _model(text, policy, every=2)
    decoder, _ = split_units(model, text.adapter.parallel_plan(model))
    assert len(decoder) == 2
    calls = [0, 0]
    for i, name in enumerate(decoder):  # a child runs once per forward and per recompute
        mlp = model.get_submodule(name).mlp
        mlp.register_forward_pre_hook(lambda *_, i=i: calls.__setitem__(i, calls[i] + 1))
    text.loss(model, text.micro_batch("packed")).backward()
    assert calls == expected


def test_selective_saves_less_than_none_and_more_than_full(text: AdapterUnderTest) -> None:
    mb = text.micro_batch("packed")
    saved = {p: _held_bytes(text, _model(text, p), mb) for p in ("none", "selective", "full")}
    assert saved["full"] < saved["selective"] < saved["none"], saved


def test_applying_twice_and_deep_copies_keep_one_checkpoint_per_unit(
    text: AdapterUnderTest,
) -> None:
    model = _model(text, "selective")
    plan = text.adapter.parallel_plan(model)
    apply_activation_checkpointing(model, plan, "full")  # already wrapped: left as is
    decoder, _ = split_units(model, plan)
    assert {unit_policy(model.get_submodule(n)) for n in decoder} == {"selective"}
    twin = copy.deepcopy(model)  # its units' forwards run the copy's weights
    mb = text.micro_batch("packed")
    base, base_grads = _loss_and_grads(text, model, mb)
    model.zero_grad(set_to_none=True)
    loss, grads = _loss_and_grads(text, twin, mb)
    assert loss == pytest.approx(base, abs=1e-6) and grads.keys() == base_grads.keys()
    assert all(p.grad is None for p in model.parameters())  # none reached the original
    layer = twin.get_submodule(decoder[0])
    assert layer.forward.__self__ is layer and unit_policy(layer) == "selective"


def test_no_recompute_without_gradients(text: AdapterUnderTest) -> None:
    model = _model(text, "full")
    with torch.no_grad():
        assert torch.isfinite(text.loss(model, text.micro_batch("packed")))


def test_the_training_loop_runs_a_policy_like_none(tmp_path: Path) -> None:
    base = run_tiny_training(tiny_text_config(tmp_path / "a"), steps=3)
    ac = run_tiny_training(
        tiny_text_config(tmp_path / "b", training={"activation_checkpointing": "selective"}),
        steps=3,
    )
    assert ac.losses == pytest.approx(base.losses, abs=1e-6)
    model = ac.trainer.unwrapped_model
    assert {unit_policy(m) for n, m in model.named_modules() if n.endswith("layers.0")} == {
        "selective"
    }


def _training(**values: Any) -> TrainingConfig:
    table = {"steps": 1, "global_batch_size": 1, "micro_batch_size": 1, "lr": 1e-3, **values}
    return converter.structure_at(table, TrainingConfig, "$.training")


def test_config_takes_policy_names_and_the_old_booleans() -> None:
    assert _training().activation_checkpointing == "none"
    assert _training(activation_checkpointing=True).activation_checkpointing == "full"
    assert _training(activation_checkpointing=False).activation_checkpointing == "none"
    cfg = _training(
        activation_checkpointing="every_n",
        activation_checkpointing_every=3,
        vision_activation_checkpointing="selective",
    )
    assert (cfg.activation_checkpointing, cfg.vision_activation_checkpointing) == (
        "every_n",
        "selective",
    )
    assert cfg.activation_checkpointing_every == 3
    assert _training(vision_activation_checkpointing=True).vision_activation_checkpointing == "full"


@pytest.mark.parametrize(
    ("values", "path"),
    [
        ({"activation_checkpointing": "sometimes"}, "$.training.activation_checkpointing"),
        ({"activation_checkpointing": 1}, "$.training.activation_checkpointing"),
        ({"vision_activation_checkpointing": "al"}, "$.training.vision_activation_checkpointing"),
        ({"activation_checkpointing_every": 0}, "$.training.activation_checkpointing_every"),
    ],
)
def test_a_bad_policy_names_its_path(values: dict[str, Any], path: str) -> None:
    with pytest.raises(ConfigError) as err:
        _training(**values)
    [(where, message)] = err.value.problems
    assert where == path
    if "every" not in path:
        assert "selective" in message and "true = full" in message


def test_recompute_fraction() -> None:
    assert recompute_fraction("none") == 0.0
    assert recompute_fraction("full") == 1.0
    assert recompute_fraction("every_n", 4) == 0.25
    assert (
        recompute_fraction("every_n") == 0.5
    )  # N = 2, as [training] activation_checkpointing_every
    assert recompute_fraction("every_n", 2, units=3) == pytest.approx(2 / 3)  # units 0 and 2
    for units in range(1, 7):  # the same units as apply_activation_checkpointing recomputes
        chosen = checkpointed_units([f"u{i}" for i in range(units)], "every_n", 3)
        assert recompute_fraction("every_n", 3, units) == pytest.approx(len(chosen) / units)
    assert recompute_fraction("selective") == 0.0
    with pytest.raises(ValueError, match="every"):
        recompute_fraction("every_n", 0)


@pytest.mark.slow  # compiling takes ~30 s on 2 CPU cores
@pytest.mark.parametrize("policy", ["selective", "every_n"])
def test_checkpointed_and_compiled_units_train_like_eager(tmp_path: Path, policy: str) -> None:
    eager = run_tiny_training(tiny_text_config(tmp_path / "eager"), steps=3)
    training = {"compile": True, "activation_checkpointing": policy}
    compiled = run_tiny_training(tiny_text_config(tmp_path / "c", training=training), steps=3)
    layer = compiled.trainer.unwrapped_model.get_submodule("model.layers.0")
    assert layer._compiled_call_impl is not None and unit_policy(layer) != "none"
    assert compiled.losses == pytest.approx(eager.losses, abs=1e-4)


def test_recompute_share_counts_whole_recomputed_units_per_tower(vl: AdapterUnderTest) -> None:
    from hyper_core.adapters.base import FlopsCount

    model = _model(vl, "every_n", "selective", every=2)
    plan = vl.adapter.parallel_plan(model)
    decoder, _ = split_units(model, plan)
    share = recompute_share(model, plan)
    assert share.text == -(-len(decoder) // 2) / len(decoder)
    assert share.vision == 0.0  # selective recomputes element-wise work only
    full = recompute_share(_model(vl, "full"), plan)
    assert (full.text, full.vision) == (1.0, 1.0)
    # a recomputed forward is a third of a unit's forward + backward FLOPs
    assert FlopsCount(text=300.0, vision=60.0).hardware(full.text, full.vision) == 480.0
    assert FlopsCount(text=300.0, vision=60.0).hardware(share.text, share.vision) == (
        300.0 * (1 + share.text / 3) + 60.0
    )
