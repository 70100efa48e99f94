"""The conformance suite as a pytest class: one test item per check.

    from hyper_core.testing.conformance_suite import AdapterConformance

    class TestMyAdapter(AdapterConformance):
        adapter = "my_model"
        tiny_config = "tiny"
        plugins = ("my_pkg.plugin",)
        distributed = True  # adds test_two_rank_fsdp2
        extra_checks = LORA_CHECKS  # e.g. hyper_peft.conformance's: adds test_lora_*
        expected_failures = {"export_roundtrip": "stock class drops the projector's bias"}
        not_applicable = {"stock_inference": "transformers has no class for this model"}

The checks are those of :mod:`hyper_core.testing.conformance`; the adapter, its assets and
samples are built once per class. A check that does not apply to the adapter (e.g. no stock
transformers processor loads its export) passes with a :class:`NotApplicableWarning` that says
why, shown in pytest's warnings summary. A subclass declares the checks it knows fail
(``expected_failures``: strict xfail) or do not apply (``not_applicable``), each with its
reason; a name that is no check is a ``TypeError`` when the class is defined.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar

import pytest

from .conformance import CHECKS, DISTRIBUTED_CHECKS, NotApplicable
from .conformance_fixture import AdapterUnderTest


class NotApplicableWarning(UserWarning):
    """A conformance check that does not apply to the adapter under test, and why."""


def _test_method(
    check: str,
    fn: Callable[[AdapterUnderTest], str] | None = None,
    not_applicable: str | None = None,
) -> Callable[[Any, AdapterUnderTest], None]:
    run = fn or CHECKS[check]

    def test(self: Any, conformance: AdapterUnderTest) -> None:
        try:
            if not_applicable is not None:  # declared by the subclass: not run
                raise NotApplicable(not_applicable)
            run(conformance)
        except NotApplicable as exc:
            warnings.warn(
                f"{conformance.name}: {check} not applicable: {exc}",
                NotApplicableWarning,
                stacklevel=1,
            )

    test.__name__ = f"test_{check}"
    test.__doc__ = run.__doc__
    return test


class AdapterConformance:
    """Base class of an adapter's conformance tests; subclasses set :attr:`adapter`."""

    #: The registered adapter name.
    adapter: ClassVar[str] = ""
    #: A named config of the adapter, or ``[model]`` keys.
    tiny_config: ClassVar[str | Mapping[str, Any]] = "tiny"
    #: Plugin modules to load (default: every installed plugin).
    plugins: ClassVar[Sequence[Any]] = ()
    #: A JSONL path or raw samples (default: the kit's samples).
    sample_data: ClassVar[Any] = None
    #: Also run the 2-rank ``fsdp2`` check (launches ``torch.distributed.run``).
    distributed: ClassVar[bool] = False
    #: More checks of the same form (name -> check), e.g. ``hyper_peft.conformance.LORA_CHECKS``.
    extra_checks: ClassVar[Mapping[str, Callable[[AdapterUnderTest], str]]] = {}
    #: Checks known to fail for this adapter (name -> why): strict ``xfail``, so a check that
    #: starts passing is reported and the entry can go.
    expected_failures: ClassVar[Mapping[str, str]] = {}
    #: Checks that do not apply to this adapter (name -> why): not run; they pass with a
    #: :class:`NotApplicableWarning` giving the reason, like a check that finds so itself.
    not_applicable: ClassVar[Mapping[str, str]] = {}

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        known = {*CHECKS, *cls.extra_checks}
        for field in ("expected_failures", "not_applicable"):
            unknown = sorted(set(getattr(cls, field)) - known)
            if unknown:
                raise TypeError(
                    f"{cls.__name__}.{field} names no check: {', '.join(unknown)} "
                    f"(the checks: {', '.join(sorted(known))})"
                )
        checks = {name: CHECKS[name] for name in CHECKS}
        checks.update(cls.extra_checks)
        for check, fn in checks.items():
            if check in DISTRIBUTED_CHECKS and not cls.distributed:
                continue
            test: Any = _test_method(check, fn, cls.not_applicable.get(check))
            if check in cls.expected_failures:
                test = pytest.mark.xfail(reason=cls.expected_failures[check], strict=True)(test)
            if check in DISTRIBUTED_CHECKS:  # multi-process: under the `slow` marker
                test = pytest.mark.slow(test)
            setattr(cls, f"test_{check}", test)

    @pytest.fixture(scope="class")
    @classmethod
    def conformance(cls, tmp_path_factory: pytest.TempPathFactory) -> AdapterUnderTest:
        """The adapter under test, built once per class."""
        if not cls.adapter:
            raise TypeError(f"{cls.__name__} must set `adapter`")
        return AdapterUnderTest(
            cls.adapter,
            cls.tiny_config,
            cls.sample_data,
            plugins=cls.plugins,
            workdir=tmp_path_factory.mktemp(f"conformance-{cls.adapter}"),
        )
