"""What a third party's conformance subclass can declare (expected failures, checks that do not
apply), and the stock-inference check's view of missing optional packages and model inputs."""

from __future__ import annotations

import warnings
from typing import Any, ClassVar

import pytest

from hyper_core.testing.conformance_inference import (
    _missing_backend,
    missing_packages,
    model_inputs,
)
from hyper_core.testing.conformance_suite import AdapterConformance, NotApplicableWarning


class _Declared(AdapterConformance):
    adapter = "hf_causal_lm"
    expected_failures: ClassVar = {"flops": "counts no attention yet"}
    not_applicable: ClassVar = {"stock_inference": "transformers has no class for this model"}


def test_an_expected_failure_is_a_strict_xfail_with_its_reason() -> None:
    [mark] = [m for m in _Declared.test_flops.pytestmark if m.name == "xfail"]
    assert mark.kwargs == {"reason": "counts no attention yet", "strict": True}
    assert not hasattr(_Declared.test_builds, "pytestmark")  # the others are untouched


def test_a_check_declared_not_applicable_is_not_run_and_says_why() -> None:
    class Subject:  # running the check on this would fail at once
        name = "declared"

    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        _Declared().test_stock_inference(Subject())  # type: ignore[arg-type]
    [warning] = [w for w in seen if issubclass(w.category, NotApplicableWarning)]
    assert "stock_inference not applicable: transformers has no class" in str(warning.message)


def test_a_declaration_naming_no_check_is_refused_when_the_class_is_made() -> None:
    with pytest.raises(TypeError, match="expected_failures names no check: flop"):

        class Typo(AdapterConformance):
            adapter = "hf_causal_lm"
            expected_failures: ClassVar = {"flop": "typo"}


def test_any_error_naming_a_missing_optional_package_is_the_fallback() -> None:
    # torchvision cannot be imported with this torch; the family raises ValueError for it
    video = ValueError("Qwen2VLVideoProcessor requires the Torchvision library, not found")
    assert missing_packages(video) == ["torchvision"]
    assert _missing_backend(video)
    assert not _missing_backend(ValueError("image_size must be positive"))
    # named but installed (PyAV is a dependency): a real error, not a missing package
    assert not _missing_backend(ValueError("av could not decode the file: bad header"))


def test_generate_gets_only_what_the_model_takes() -> None:
    class Model:
        def forward(self, input_ids: Any, pixel_values: Any = None, **kwargs: Any) -> None: ...

        def prepare_inputs_for_generation(self, input_ids: Any, token_type_ids: Any = None): ...

    inputs = {"input_ids": 1, "pixel_values": 2, "token_type_ids": 3, "num_crops": 4}
    assert model_inputs(Model(), inputs) == {"input_ids": 1, "pixel_values": 2, "token_type_ids": 3}
