"""Progress of a run, saved in every checkpoint."""

from __future__ import annotations

from typing import Any

import attrs


@attrs.define(kw_only=True)
class TrainState:
    """Counters of the run; ``global_step`` counts finished steps, skipped ones included.

    ``bad_steps`` counts the steps whose update was skipped for a non-finite loss or gradient
    norm; ``bad_streak`` the consecutive ones up to the last step (both are saved, so a resumed
    run stops at the same step as an uninterrupted one).
    """

    global_step: int = 0
    epoch: int = 0
    samples_seen: int = 0
    tokens_seen: int = 0
    skipped: dict[str, int] = attrs.field(factory=dict)
    bad_steps: int = 0
    bad_streak: int = 0
    stop_requested: bool = False

    def to_dict(self) -> dict[str, Any]:
        """JSON-able state (``stop_requested`` is not saved)."""
        d = attrs.asdict(self)
        d.pop("stop_requested")
        return d

    def load_dict(self, d: dict[str, Any]) -> None:
        """Restore from :meth:`to_dict`."""
        self.global_step = int(d["global_step"])
        self.epoch = int(d["epoch"])
        self.samples_seen = int(d.get("samples_seen", 0))
        self.tokens_seen = int(d.get("tokens_seen", 0))
        self.skipped = dict(d.get("skipped", {}))
        self.bad_steps = int(d.get("bad_steps", 0))
        self.bad_streak = int(d.get("bad_streak", 0))
