"""How many attention calls ran the kernel the config asked for, and why the others did not.

``flash_varlen`` notes each call on the run's :class:`AttentionCounts` while the trainer has
it :func:`active <counting>`: a kernel call, or a fallback with its reason (a padding mask, a
KV cache, fp32 inputs on CUDA, ...). The first fallback of each reason is logged once per run;
the counts go to ``metrics.jsonl`` (``attn/kernel_calls``, ``attn/fallback_calls``) and the
run's end line. Under ``torch.compile`` the increments are Python side effects that dynamo
replays after each call of the compiled graph, so compiled layers count like eager ones.

The counter is the run's (the trainer owns it); this module only keeps which counter is
active, a stack so that nested or successive runs in one process never share counts.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

log = logging.getLogger("hyper_train")


class AttentionCounts:
    """Attention calls of one run: on the kernel (recomputation included), and fallbacks by
    reason.

    The kernel count is a device tensor that compiled code adds to in place: a Python int
    there would be a constant that dynamo guards on, recompiling the layer at every call.
    Reading it (:attr:`kernel_calls`) is one device sync, paid when metrics are logged.
    """

    def __init__(self, device: torch.device | str = "cpu") -> None:
        import torch

        self._kernel = torch.zeros((), dtype=torch.int64, device=device)
        #: Fallback calls by reason (counted eagerly: a fallback runs outside compiled code).
        self.fallbacks: dict[str, int] = {}

    @property
    def kernel_calls(self) -> int:
        """Calls that ran the kernel."""
        return int(self._kernel.item())

    @property
    def fallback_calls(self) -> int:
        """All fallbacks, whatever the reason."""
        return sum(self.fallbacks.values())

    def metrics(self) -> dict[str, int]:
        """The ``metrics.jsonl`` fields."""
        return {"attn/kernel_calls": self.kernel_calls, "attn/fallback_calls": self.fallback_calls}

    def summary(self) -> str:
        """One line for the run's end: kernel calls, fallbacks and their reasons."""
        line = f"{self.kernel_calls} call(s) on the kernel, {self.fallback_calls} fell back"
        if self.fallbacks:
            reasons = "; ".join(f"{n} × {reason}" for reason, n in sorted(self.fallbacks.items()))
            line += f" ({reasons})"
        return line


_ACTIVE: list[AttentionCounts] = []


@contextlib.contextmanager
def counting(counts: AttentionCounts) -> Iterator[AttentionCounts]:
    """Count the attention calls made inside the block on ``counts``."""
    _ACTIVE.append(counts)
    try:
        yield counts
    finally:
        _ACTIVE.remove(counts)


def note_kernel() -> None:
    """One call ran the kernel."""
    if _ACTIVE:
        _ACTIVE[-1]._kernel.add_(1)


def note_fallback(reason: str) -> None:
    """One call fell back from the kernel, for ``reason`` (logged the first time per run)."""
    if not _ACTIVE:
        return
    counts = _ACTIVE[-1]
    seen = counts.fallbacks.get(reason, 0)
    if not seen:
        log.warning("flash_varlen: attention falls back from the kernel: %s", reason)
    counts.fallbacks[reason] = seen + 1
