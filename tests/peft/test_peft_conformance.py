"""Every in-repo adapter passes the LoRA conformance checks (``hyper_peft.conformance``) with no
change to it; ``extra_checks`` adds them to a third party's suite."""

from __future__ import annotations

import importlib.util
from typing import Any

import pytest

from hyper_core.testing.conformance import AdapterUnderTest, check_adapter
from hyper_peft.conformance import LORA_CHECKS


def _needs(module: str) -> Any:
    return pytest.mark.skipif(importlib.util.find_spec(module) is None, reason=f"needs {module}")


ADAPTERS = [
    pytest.param(("hf_causal_lm", "tiny-qwen2"), id="hf_causal_lm"),
    *(
        pytest.param((name, "tiny"), id=name, marks=_needs("hyper_qwen_vl"))
        for name in ("qwen2_vl", "qwen2_5_vl", "qwen3_vl", "qwen3_vl_moe")
    ),
    pytest.param(("kimi_k25", "tiny"), id="kimi_k25", marks=_needs("hyper_kimi_k26")),
]


@pytest.fixture(scope="module", params=ADAPTERS)
def subject(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Any:
    name, tiny = request.param
    return AdapterUnderTest(name, tiny, workdir=tmp_path_factory.mktemp(f"lora-{name}"))


@pytest.mark.parametrize("check", list(LORA_CHECKS))
def test_in_repo_adapter_passes_the_lora_checks(subject: AdapterUnderTest, check: str) -> None:
    LORA_CHECKS[check](subject)


def test_extra_checks_run_after_the_core_ones_and_fail_alone(tmp_path: Any) -> None:
    """``check_adapter(extra_checks=...)`` reports each extra check like a core one; a LoRA
    check that fails is that check's failure only."""
    calls: list[str] = []

    def broken(t: AdapterUnderTest) -> str:
        calls.append(t.name)
        raise AssertionError("LoRA broke it")

    report = check_adapter(
        "hf_causal_lm",
        "tiny-qwen2",
        workdir=tmp_path,
        raise_on_failure=False,
        extra_checks={"lora_trainable": LORA_CHECKS["lora_trainable"], "broken": broken},
    )
    status = {r.name: r.status for r in report.results}
    assert list(status)[-2:] == ["lora_trainable", "broken"]
    assert status["lora_trainable"] == "passed"
    assert [r.name for r in report.failures] == ["broken"]
    assert calls == ["hf_causal_lm"]
