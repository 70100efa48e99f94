"""Per-sample data errors and the counter of skipped samples (no torch here)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping


class SampleError(Exception):
    """One sample cannot be used.

    ``reason`` is a short category key used to count skips (``invalid_json``,
    ``missing_image``, ``corrupt_image``, ``too_long``, ``image_token_mismatch``,
    ``bad_format``, ``no_loss_tokens``, ...); ``message`` says what exactly is wrong.
    """

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(f"{reason}: {message}")
        self.reason = reason
        self.message = message

    def __reduce__(self) -> tuple[type[SampleError], tuple[str, str]]:
        return (type(self), (self.reason, self.message))


class SkipCounter:
    """Counts skipped samples by reason."""

    def __init__(self, counts: Mapping[str, int] | Iterable[str] | None = None) -> None:
        self._counts: Counter[str] = Counter()
        if isinstance(counts, Mapping):
            self._counts.update(dict(counts))
        elif counts is not None:
            self._counts.update(counts)

    def add(self, reason: str, n: int = 1) -> None:
        """Count ``n`` skipped samples of ``reason``."""
        self._counts[reason] += n

    def merge(self, other: SkipCounter | Mapping[str, int]) -> SkipCounter:
        """Add the counts of ``other`` (another counter or a ``reason -> count`` dict)."""
        counts = other.as_dict() if isinstance(other, SkipCounter) else other
        for reason, n in counts.items():
            self._counts[reason] += int(n)
        return self

    def as_dict(self) -> dict[str, int]:
        """``reason -> count``, sorted by reason, zero counts left out."""
        return {k: v for k, v in sorted(self._counts.items()) if v}

    @property
    def total(self) -> int:
        """All skipped samples."""
        return sum(self._counts.values())

    def __bool__(self) -> bool:
        return self.total > 0

    def __eq__(self, other: object) -> bool:
        if isinstance(other, SkipCounter):
            return self.as_dict() == other.as_dict()
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def summary_line(self) -> str:
        """E.g. ``skipped 3 samples: missing_image=2, too_long=1`` (most frequent first)."""
        total = self.total
        if not total:
            return "skipped 0 samples"
        items = sorted(self.as_dict().items(), key=lambda kv: (-kv[1], kv[0]))
        parts = ", ".join(f"{k}={v}" for k, v in items)
        return f"skipped {total} sample{'s' if total != 1 else ''}: {parts}"

    def __repr__(self) -> str:
        return f"SkipCounter({self.as_dict()!r})"
