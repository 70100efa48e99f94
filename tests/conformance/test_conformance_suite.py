"""The conformance suite itself: in-repo adapters pass it; broken adapters fail the check
that covers what they break, and only that one."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from hyper_core.builtin.hf_causal_lm import HFCausalLMAdapter
from hyper_core.hookspecs import hookimpl
from hyper_core.testing.conformance import CHECKS, ConformanceReport, check_adapter
from hyper_core.testing.conformance_suite import AdapterConformance


class TestHFCausalLM(AdapterConformance):
    adapter = "hf_causal_lm"
    tiny_config = "tiny-qwen2"
    distributed = True


class Truncating(HFCausalLMAdapter):
    """Cuts long samples to ``max_seq_len`` instead of rejecting them."""

    def transform(self, sample: Any, assets: Any, *, max_seq_len: int) -> Any:
        import attrs

        f = super().transform(sample, assets, max_seq_len=10_000)
        return attrs.evolve(f, input_ids=f.input_ids[:max_seq_len], labels=f.labels[:max_seq_len])


class WrongPlan(HFCausalLMAdapter):
    """Names sharding units that don't exist."""

    def parallel_plan(self, model: Any) -> Any:
        from hyper_core.adapters.base import ParallelPlan

        return ParallelPlan(sharding_units=("model.blocks.*",))


class KeepsCache(HFCausalLMAdapter):
    """Forgets ``use_cache=False``: transformers then ignores the packing."""

    def forward_kwargs(self) -> dict[str, Any]:
        return {"use_cache": True}


class NoFlops(HFCausalLMAdapter):
    """Counts nothing."""

    def flops(self, model: Any, micro_batch: Any) -> Any:
        from hyper_core.adapters.base import FlopsCount

        return FlopsCount(text=0.0)


class LossyExport(HFCausalLMAdapter):
    """Exports the weights with one tensor left at zero."""

    def export_hf(self, state_dict: Any, hf_config: Any, out_dir: Any, assets: Any = None) -> None:
        sd = dict(state_dict)
        name = next(k for k in sd if k.endswith("mlp.down_proj.weight"))
        sd[name] = sd[name] * 0
        super().export_hf(sd, hf_config, out_dir, assets)


class AllPositions(HFCausalLMAdapter):
    """Declares logits at label positions only, but its model drops ``logits_to_keep``."""

    def build_model(self, model_config: Any, **kwargs: Any) -> Any:
        model = super().build_model(model_config, **kwargs)
        forward = model.forward

        def every_position(*args: Any, logits_to_keep: Any = 0, **kw: Any) -> Any:
            return forward(*args, **kw)

        model.forward = every_position
        return model


class KeysAtLabelRows(HFCausalLMAdapter):
    """Runs the last layer's key projection at label rows only: the keys of every other
    position are then missing from the label rows' attention."""

    label_row_children = ("self_attn.k_proj", "mlp")


BROKEN = {
    "truncating": (Truncating, "transform"),
    "wrong_plan": (WrongPlan, "parallel_plan"),
    "keeps_cache": (KeepsCache, "packed_equals_padded"),
    "no_flops": (NoFlops, "flops"),
    "lossy_export": (LossyExport, "export_roundtrip"),
    "all_positions": (AllPositions, "label_positions"),
    "keys_at_label_rows": (KeysAtLabelRows, "label_positions"),
}


class BrokenAdapters:
    @hookimpl
    def register_model_adapters(self, register: Any) -> None:
        for name, (cls, _) in BROKEN.items():
            register(name, cls)


@pytest.mark.parametrize("name", list(BROKEN))
def test_a_broken_adapter_fails_its_check(name: str, tmp_path: Path) -> None:
    report = check_adapter(
        name, "tiny-qwen2", plugins=[BrokenAdapters()], workdir=tmp_path, raise_on_failure=False
    )
    assert [r.name for r in report.failures] == [BROKEN[name][1]], str(report)
    assert len(report.passed) == len(CHECKS) - 2  # the distributed check is not run


def test_check_adapter_raises_with_the_report(tmp_path: Path) -> None:
    with pytest.raises(AssertionError) as info:
        check_adapter("wrong_plan", "tiny-qwen2", plugins=[BrokenAdapters()], workdir=tmp_path)
    lines = {line.split()[0]: line.split(None, 1)[1] for line in str(info.value).splitlines()[1:]}
    assert lines["parallel_plan"].startswith("failed: AssertionError: sharding unit")
    assert "'model.blocks.*' matches no module" in lines["parallel_plan"]
    assert lines["builds"].startswith("passed")
    assert lines["two_rank_fsdp2"] == "not run: distributed=False"


def test_unknown_adapter_fails_every_check(tmp_path: Path) -> None:
    report = check_adapter(
        "no_such_model", plugins=[BrokenAdapters()], workdir=tmp_path, raise_on_failure=False
    )
    assert isinstance(report, ConformanceReport)
    assert len(report.failures) == len(CHECKS) - 1
    assert "no_such_model" in report.failures[0].detail
