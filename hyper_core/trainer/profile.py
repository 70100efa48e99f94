"""``[logging] profile_steps = [FIRST, LAST]``: ``torch.profiler`` over those training steps.

Each rank writes ``output_dir/profile/trace-rankN.json`` (a Chrome/Perfetto trace) and
``ops-rankN.txt`` (the op table, sorted by self device time on CUDA, by self CPU time
otherwise). Steps are numbered as in ``metrics.jsonl`` (the first is 1). A run that resumes
inside the window profiles what is left of it; a run that ends inside it writes what it saw.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING

from ..hookspecs import hookimpl

if TYPE_CHECKING:
    import torch.profiler

    from ..types import TrainState

log = logging.getLogger("hyper_train")

#: Rows of the op table.
TABLE_ROWS = 40


class StepProfiler:
    """The per-run profiler object (``hyper_core.builtin.step_profiler``' ``build_callbacks``)."""

    def __init__(self, first: int, last: int, output_dir: str | Path, rank: int) -> None:
        self.first, self.last = first, last
        self.out = Path(output_dir) / "profile"
        self.rank = rank
        self._prof: torch.profiler.profile | None = None  # while the window runs
        self._started = 0
        self._done = False

    @hookimpl
    def on_step_begin(self, state: TrainState) -> None:
        step = state.global_step + 1  # the step about to run
        if self._prof is None and not self._done and self.first <= step <= self.last:
            import torch
            from torch.profiler import ProfilerActivity, profile

            activities = [ProfilerActivity.CPU]
            if torch.cuda.is_available():
                activities.append(ProfilerActivity.CUDA)
            self._prof = profile(activities=activities)
            self._prof.__enter__()
            self._started = step

    @hookimpl
    def on_step_end(self, state: TrainState) -> None:
        if self._prof is not None and state.global_step >= self.last:
            self._write(state.global_step)

    @hookimpl
    def on_train_end(self, state: TrainState) -> None:
        if self._prof is not None:  # the run ended inside the window
            self._write(state.global_step)

    def _write(self, step: int) -> None:
        import torch

        prof, self._prof, self._done = self._prof, None, True
        prof.__exit__(None, None, None)
        self.out.mkdir(parents=True, exist_ok=True)
        prof.export_chrome_trace(str(self.out / f"trace-rank{self.rank}.json"))
        key = "self_device_time_total" if torch.cuda.is_available() else "self_cpu_time_total"
        table = prof.key_averages().table(sort_by=key, row_limit=TABLE_ROWS)
        header = f"steps {self._started}-{step}, rank {self.rank}, torch {torch.__version__}\n"
        (self.out / f"ops-rank{self.rank}.txt").write_text(header + table + "\n")
        if self.rank == 0:
            log.info("profile: steps %d-%d written to %s", self._started, step, self.out)
