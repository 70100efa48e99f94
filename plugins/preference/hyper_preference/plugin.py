"""The preference plugin's hook implementations (entry point ``preference``).

Imports no torch. A run that sets ``[preference] loss`` reads chosen/rejected pairs (the
``preference`` dataset format, or pairs in any format the core reads), and gets a
:class:`~hyper_preference.run.PreferenceRun` (from ``build_callbacks``) for its loss,
reference and metrics. The transform is wrapped at module level, so that ``hyper-train data
stats`` (which builds no run) sees pairs too.
"""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

from hyper_core import hookimpl

SECTION = "preference"


def _section(config: Any) -> Any:
    cfg = config.section(SECTION)
    return cfg if cfg is not None and cfg.enabled else None


@hookimpl
def register_config_sections(register: Any) -> None:
    """``[preference]``."""
    register(SECTION, "hyper_preference.config:PreferenceConfig")


@hookimpl
def register_dataset_formats(register: Any) -> None:
    """``preference``: pairs from JSON lines, a JSON array or Parquet; ``shapes_pairs``: the
    synthetic shapes data with a plausible wrong answer rejected (the demo)."""
    register(
        "preference",
        "hyper_preference.data:load_preference_format",
        options="hyper_preference.data:PreferenceOptions",
    )
    register(
        "shapes_pairs",
        "hyper_preference.shapes:load_shapes_pairs_format",
        options="hyper_core.demo.shapes:ShapesOptions",
    )


@hookimpl
def build_callbacks(config: Any) -> Any:
    """A :class:`~hyper_preference.run.PreferenceRun` when ``[preference] loss`` is set."""
    cfg = _section(config)
    if cfg is None:
        return None
    from .run import PreferenceRun

    return PreferenceRun(cfg, config)


@hookimpl(wrapper=True)
def build_data_transform(config: Any) -> Generator[None, Any, Any]:
    """Each pair's two conversations through the run's transform."""
    transform = yield
    if _section(config) is None:
        return transform
    from .data import PairTransform

    return PairTransform(transform)
