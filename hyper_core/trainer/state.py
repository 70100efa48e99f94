"""Progress of a run, saved in every checkpoint."""

from __future__ import annotations

from typing import Any

import attrs


@attrs.define(kw_only=True)
class TrainState:
    """Counters of the run; ``global_step`` counts finished optimizer steps."""

    global_step: int = 0
    epoch: int = 0
    samples_seen: int = 0
    tokens_seen: int = 0
    skipped: dict[str, int] = attrs.field(factory=dict)
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
