"""The ``[memory_profiler]`` config section (no torch import here)."""

from __future__ import annotations

import re
from typing import Any

import attrs

from hyper_core.config.fields import at_least, greater_than, meta, not_empty

_RANGE = re.compile(r"^\s*(\d+)\s*(?:-|\.\.)\s*(\d+)\s*$")


@attrs.frozen(kw_only=True)
class StepSelection:
    """The optimizer steps (1-based, like ``metrics.jsonl``'s ``step``) recorded in detail."""

    first: int
    #: The last selected step; None for ``"all"`` (the run's last step).
    last: int | None
    #: The explicit set for a list; None for a range.
    explicit: frozenset[int] | None = None

    def __contains__(self, step: int) -> bool:
        if self.explicit is not None:
            return step in self.explicit
        return step >= self.first and (self.last is None or step <= self.last)


def parse_steps(value: list[int] | str) -> StepSelection:
    """``[1, 3]`` (those steps), ``"2-5"`` or ``"2..5"`` (inclusive range), or ``"all"``.

    Raises ``ValueError`` with a message for the config error.
    """
    if isinstance(value, str):
        text = value.strip().lower()
        if text == "all":
            return StepSelection(first=1, last=None)
        match = _RANGE.match(text)
        if match is None:
            raise ValueError(f"expected a list of steps, 'A-B' or 'all', got {value!r}")
        first, last = int(match.group(1)), int(match.group(2))
        if first < 1 or last < first:
            raise ValueError(f"range {value!r} must satisfy 1 <= A <= B")
        return StepSelection(first=first, last=last)
    if not value:
        raise ValueError("must name at least one step")
    bad = [s for s in value if s < 1]
    if bad:
        raise ValueError(f"steps are 1-based, got {bad[0]}")
    return StepSelection(first=min(value), last=max(value), explicit=frozenset(value))


def _check_steps(_inst: Any, _attr: attrs.Attribute, value: list[int] | str) -> None:
    parse_steps(value)


@attrs.frozen(kw_only=True)
class MemoryProfilerConfig:
    """``[memory_profiler]``: memory accounting per build stage and per step, snapshots, report."""

    enabled: bool = attrs.field(default=False, metadata=meta("Profile this run's memory."))
    steps: list[int] | str = attrs.field(
        factory=lambda: [1, 2, 3],
        validator=_check_steps,
        metadata=meta(
            "Steps recorded in detail (rows in the report, activation measurement, CUDA "
            "allocator history from the first to the last): a list like `[1, 3]`, a range "
            '`"2-5"`, or `"all"`. Step peaks are taken on every step regardless.'
        ),
    )
    output_dir: str = attrs.field(
        default="memory",
        validator=not_empty,
        metadata=meta("Where the outputs go, relative to `[run] output_dir` (or absolute)."),
    )
    max_entries: int = attrs.field(
        default=100_000,
        validator=at_least(1),
        metadata=meta("Allocator events kept by `torch.cuda.memory._record_memory_history`."),
    )
    snapshots: bool = attrs.field(
        default=True,
        metadata=meta("Dump a CUDA allocator snapshot per rank (`snapshot_rank{R}.pickle`)."),
    )
    activations: bool = attrs.field(
        default=True,
        metadata=meta(
            "Measure the bytes autograd saves for backward during micro-batch 0 of each "
            "recorded step (`saved_tensors_hooks`, shared storages counted once)."
        ),
    )
    sample_interval_ms: float = attrs.field(
        default=2.0,
        validator=greater_than(0.0),
        metadata=meta("CPU only: how often a background thread samples the RSS for step peaks."),
    )
    plot: bool = attrs.field(
        default=True,
        metadata=meta("Draw `memory.png` (needs matplotlib: the plugin's `plot` extra)."),
    )
    compare_estimate: bool = attrs.field(
        default=True,
        metadata=meta(
            "Add the `hyper-train memory estimate` prediction for this run's measured batch "
            "shape to the summary and report (rank 0, meta device)."
        ),
    )

    @property
    def selection(self) -> StepSelection:
        """The parsed ``steps``."""
        return parse_steps(self.steps)
