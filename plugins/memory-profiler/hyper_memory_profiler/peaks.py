"""Per-step peak memory.

* CUDA: ``torch.cuda.reset_peak_memory_stats`` at the step's start, ``max_memory_allocated``
  (and ``max_memory_reserved``) at its end.
* CPU (Linux): a daemon thread samples the RSS from ``/proc/self/statm`` every
  ``interval_ms`` (2 ms by default) and keeps the maximum since the last reset. Growth that
  lives shorter than the interval can be missed.
* CPU without ``/proc``: ``getrusage`` ``ru_maxrss`` at the step's end; it only moves when the
  process exceeds its lifetime high-water mark, so a step's peak below an earlier one reads as
  that earlier peak.
"""

from __future__ import annotations

import threading
from typing import Any

from .accounting import current_rss, max_rss


class StepPeaks:
    """Measures the peak memory of one step at a time (``begin()`` … ``end()``)."""

    def __init__(self, device: Any, interval_ms: float = 2.0) -> None:
        self.cuda = device is not None and getattr(device, "type", "cpu") == "cuda"
        self.device = device
        self.interval_s = interval_ms / 1000.0
        self._lock = threading.Lock()
        self._peak = 0
        self._start = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        if self.cuda:
            self.method = "cuda max_memory_allocated (reset per step)"
        elif current_rss() is not None:
            self.method = f"RSS sampled every {interval_ms:g} ms by a background thread"
        else:
            self.method = "getrusage ru_maxrss (lifetime high-water mark)"

    # -- CPU sampler ----------------------------------------------------------------------------

    def start(self) -> None:
        """Start the RSS sampler (CPU with ``/proc``); a no-op otherwise."""
        if self.cuda or self._thread is not None or current_rss() is None:
            return
        self._stop.clear()
        self._thread = threading.Thread(
            target=self._sample, name="hyper-train-rss-sampler", daemon=True
        )
        self._thread.start()

    def _sample(self) -> None:
        while not self._stop.wait(self.interval_s):
            rss = current_rss()
            if rss is None:
                return
            with self._lock:
                if rss > self._peak:
                    self._peak = rss

    def close(self) -> None:
        """Stop the sampler thread."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=1.0)
            self._thread = None

    # -- one step -------------------------------------------------------------------------------

    def begin(self) -> None:
        """A step starts: reset the peak to the current usage."""
        if self.cuda:
            import torch

            torch.cuda.reset_peak_memory_stats(self.device)
            self._start = int(torch.cuda.memory_allocated(self.device))
            return
        now = current_rss()
        with self._lock:
            self._start = now if now is not None else max_rss()
            self._peak = self._start

    def end(self) -> dict[str, int]:
        """The step ended: ``{"start", "peak", "delta"}`` (bytes; CUDA adds ``peak_reserved``)."""
        if self.cuda:
            import torch

            peak = int(torch.cuda.max_memory_allocated(self.device))
            return {
                "start": self._start,
                "peak": peak,
                "delta": max(peak - self._start, 0),
                "peak_reserved": int(torch.cuda.max_memory_reserved(self.device)),
            }
        now = current_rss()
        with self._lock:
            peak = max(self._peak, now if now is not None else max_rss())
        return {"start": self._start, "peak": peak, "delta": max(peak - self._start, 0)}
