"""LoRA checks for the adapter conformance suite: an adapter works with ``[peft]`` unchanged.

Run them with the core's checks::

    from hyper_core.testing.conformance import check_adapter
    from hyper_peft.conformance import LORA_CHECKS

    check_adapter("my_model", "tiny", plugins=["my_pkg.plugin"], extra_checks=LORA_CHECKS)

or as pytest items, ``extra_checks = LORA_CHECKS`` on an
:class:`~hyper_core.testing.conformance_suite.AdapterConformance` subclass. Each check takes
the :class:`~hyper_core.testing.conformance.AdapterUnderTest` and injects LoRA (r=4 on every
linear layer but the output head, peft's init with a seeded non-zero ``lora_B``) into the
adapter's tiny model, as the plugin does in a run.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .config import PeftConfig
from .lora import LORA_MARK, apply_lora, resolve_targets

#: The ``[peft]`` section the checks use.
CONFORMANCE_PEFT = PeftConfig(method="lora", r=4, alpha=8.0)
#: Tolerance of the equivalence checks (the core suite's).
ATOL = 1e-5


def _lora_model(t: Any, nonzero_b: bool = True) -> Any:
    """The adapter's tiny model with LoRA injected; ``lora_B`` seeded non-zero (peft's init
    is zero) so that the adapters change the outputs."""
    import torch

    model = t.build_model()
    apply_lora(model, t.adapter, CONFORMANCE_PEFT)
    if nonzero_b:
        generator = torch.Generator().manual_seed(1)
        with torch.no_grad():
            for name, param in sorted(model.named_parameters()):
                if ".lora_B." in name:
                    param.copy_(torch.randn(param.shape, generator=generator) * 0.02)
    return model


def check_lora_trainable(t: Any) -> str:
    """LoRA goes into the adapter's linear layers with no change to the adapter: only the
    LoRA weights train, as many as peft's own ``get_peft_model`` makes trainable, and the
    parallel plan's units and freeze groups still name modules of the model."""
    from peft import LoraConfig, get_peft_model

    from hyper_core.adapters.hf import match_modules

    model = _lora_model(t, nonzero_b=False)
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trainable and all(LORA_MARK in n for n in trainable), "non-LoRA weights train"
    reference = t.build_model()
    targets = resolve_targets(reference, t.adapter, CONFORMANCE_PEFT)
    reference = get_peft_model(reference, LoraConfig(r=4, lora_alpha=8, target_modules=targets))
    want, total = reference.get_nb_trainable_parameters()
    got = sum(p.numel() for p in model.parameters() if p.requires_grad)
    assert got == want, f"{got} trainable parameters, peft's own count is {want}"
    assert sum(p.numel() for p in model.parameters()) == total
    plan = t.adapter.parallel_plan(model)
    for pattern in plan.sharding_units:
        assert match_modules(model, (pattern,)), f"with LoRA, unit {pattern!r} matches nothing"
    for paths in t.adapter.freeze_groups(model).values():
        for path in paths:
            model.get_submodule(path)  # raises for a group whose module moved
    return f"{got} of {total} parameters trainable ({len(targets)} layers)"


def check_lora_train_step(t: Any) -> str:
    """With LoRA a packed step gives finite gradients to the LoRA weights only (the vision
    encoder's too on a VL adapter); one step lowers the loss and leaves every base weight
    bit-identical."""
    import torch

    model = _lora_model(t)
    base = {n: p.detach().clone() for n, p in model.named_parameters() if not p.requires_grad}
    mb = t.micro_batch("packed")
    loss = t.loss(model, mb)
    assert torch.isfinite(loss), f"loss is {loss.item()}"
    loss.backward()
    grads = {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
    assert grads and all(LORA_MARK in n for n in grads), "a frozen weight got a gradient"
    assert all(g.isfinite().all() for g in grads.values()), "non-finite gradients"
    plan = t.adapter.parallel_plan(model)
    if plan.vision_encoder is not None and mb.num_images:
        prefix = plan.vision_encoder.module + "."
        assert any(n.startswith(prefix) and g.abs().sum() > 0 for n, g in grads.items()), (
            "the vision encoder's LoRA weights got no gradient"
        )
    torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.05).step()
    with torch.no_grad():
        after = t.loss(model, mb)
    assert after < loss, f"one step did not lower the loss ({loss.item():.4f} -> {after:.4f})"
    params = dict(model.named_parameters())
    assert all(torch.equal(params[n], v) for n, v in base.items()), "a base weight changed"
    return f"loss {loss.item():.4f} -> {after.item():.4f}"


def check_lora_export(t: Any) -> str:
    """The LoRA weights written as a PEFT adapter directory load with
    ``PeftModel.from_pretrained`` onto the adapter's base model, and merged into the base
    weights, to the same logits (1e-5)."""
    import torch
    from peft import PeftModel

    from .export import merge_lora, save_adapter_dir
    from .lora import saved_modules

    model = _lora_model(t).eval()
    trained = {n: p.detach() for n, p in model.named_parameters() if p.requires_grad}
    targets = resolve_targets(t.build_model(), t.adapter, CONFORMANCE_PEFT)
    to_save = saved_modules(model, CONFORMANCE_PEFT)
    out = save_adapter_dir(trained, CONFORMANCE_PEFT, targets, to_save, t.workdir / "lora")
    mb = t.micro_batch("padded")
    kwargs = t.adapter.forward_kwargs()
    loaded = PeftModel.from_pretrained(t.build_model(), str(out)).eval()
    with torch.no_grad():
        expected = model(**mb.model_inputs, **kwargs).logits
        base = t.build_model().eval()(**mb.model_inputs, **kwargs).logits
        assert (expected - base).abs().max() > 10 * ATOL, "the adapters change nothing"
        diffs = {"adapter directory": loaded(**mb.model_inputs, **kwargs).logits}
        merge_lora(model)
        diffs["merged"] = model(**mb.model_inputs, **kwargs).logits
    assert not any(LORA_MARK in n for n, _ in model.named_parameters()), "merge left LoRA"
    for how, logits in diffs.items():
        diff = (logits - expected).abs().max().item()
        assert diff <= ATOL, f"logits of the {how} differ by {diff:.2e}"
    return f"{len(trained)} adapter tensors"


#: The LoRA checks, in the order they run (``extra_checks`` of the conformance suite).
LORA_CHECKS: dict[str, Callable[[Any], str]] = {
    "lora_trainable": check_lora_trainable,
    "lora_train_step": check_lora_train_step,
    "lora_export": check_lora_export,
}
