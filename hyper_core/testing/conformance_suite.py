"""The conformance suite as a pytest class: one test item per check.

    from hyper_core.testing.conformance_suite import AdapterConformance

    class TestMyAdapter(AdapterConformance):
        adapter = "my_model"
        tiny_config = "tiny"
        plugins = ("my_pkg.plugin",)
        distributed = True  # adds test_two_rank_fsdp2

The checks are those of :mod:`hyper_core.testing.conformance`; the adapter, its assets and
samples are built once per class.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar

import pytest

from .conformance import CHECKS, DISTRIBUTED_CHECKS, AdapterUnderTest


def _test_method(check: str) -> Callable[[Any, AdapterUnderTest], None]:
    def test(self: Any, conformance: AdapterUnderTest) -> None:
        CHECKS[check](conformance)

    test.__name__ = f"test_{check}"
    test.__doc__ = CHECKS[check].__doc__
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

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        for check in CHECKS:
            if check in DISTRIBUTED_CHECKS:
                if cls.distributed:  # multi-process: under the `slow` marker
                    setattr(cls, f"test_{check}", pytest.mark.slow(_test_method(check)))
            else:
                setattr(cls, f"test_{check}", _test_method(check))

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
