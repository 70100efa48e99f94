"""The conformance suite as a pytest class: one test item per check.

    from hyper_core.testing.conformance_suite import AdapterConformance

    class TestMyAdapter(AdapterConformance):
        adapter = "my_model"
        tiny_config = "tiny"
        plugins = ("my_pkg.plugin",)
        distributed = True  # adds test_two_rank_fsdp2
        extra_checks = LORA_CHECKS  # e.g. hyper_peft.conformance's: adds test_lora_*

The checks are those of :mod:`hyper_core.testing.conformance`; the adapter, its assets and
samples are built once per class. A check that does not apply to the adapter (e.g. no stock
transformers processor loads its export) passes with a :class:`NotApplicableWarning` that says
why, shown in pytest's warnings summary.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar

import pytest

from .conformance import CHECKS, DISTRIBUTED_CHECKS, AdapterUnderTest, NotApplicable


class NotApplicableWarning(UserWarning):
    """A conformance check that does not apply to the adapter under test, and why."""


def _test_method(
    check: str, fn: Callable[[AdapterUnderTest], str] | None = None
) -> Callable[[Any, AdapterUnderTest], None]:
    run = fn or CHECKS[check]

    def test(self: Any, conformance: AdapterUnderTest) -> None:
        try:
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

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        for check in CHECKS:
            if check in DISTRIBUTED_CHECKS:
                if cls.distributed:  # multi-process: under the `slow` marker
                    setattr(cls, f"test_{check}", pytest.mark.slow(_test_method(check)))
            else:
                setattr(cls, f"test_{check}", _test_method(check))
        for check, fn in cls.extra_checks.items():
            setattr(cls, f"test_{check}", _test_method(check, fn))

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
