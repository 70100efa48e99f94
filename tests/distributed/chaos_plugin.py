"""A test plugin (``--plugin chaos_plugin``) that injects failures, driven by env variables.

``HT_FAIL_RANK`` + ``HT_FAIL_AT_STEP``: that rank raises in ``on_step_begin`` when
``global_step`` equals the step (``2`` → while step 3 begins).
``HT_KILL_AT_STEP``: the process sends itself ``HT_KILL_SIGNAL`` (default SIGKILL; SIGSTOP
freezes it) in ``on_step_begin`` at that ``global_step``; only rank ``HT_KILL_RANK`` if set.
``HT_KILL_WORKER_AT_STEP``: rank ``HT_KILL_RANK`` (default 0) SIGKILLs one of its data-loader
worker processes in ``on_step_begin`` at that ``global_step``.
``HT_SIGNAL_IN_SAVE_STEP``: rank ``HT_KILL_RANK`` (default 0) sends itself ``HT_KILL_SIGNAL``
while the checkpoint of that step is being written (``on_save_checkpoint``).
``HT_STEP_DELAY_S``: every step begins that many seconds late (a slow run to signal).
Before a signal the rank prints ``chaos: rank R sends itself SIG... <when>`` to stderr (for
SIGKILL and SIGSTOP followed by an unended progress-bar fragment): its last line of output.
Imports no torch.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

from hyper_core.hookspecs import hookimpl


def _env_int(name: str) -> int | None:
    value = os.environ.get(name)
    return int(value) if value is not None else None


def _this_rank(default: str | None) -> bool:
    """Whether this rank is the one to hit (``HT_KILL_RANK``, else ``default``; None: all)."""
    wanted = os.environ.get("HT_KILL_RANK", default)
    return wanted is None or os.environ.get("RANK", "0") == wanted


def _signal() -> signal.Signals:
    return signal.Signals[os.environ.get("HT_KILL_SIGNAL", "SIGKILL")]


def _signal_self(sig: signal.Signals, when: str) -> None:
    """Send ``sig`` to this process, saying so first (its last line, if it dies)."""
    said = f"chaos: rank {os.environ.get('RANK', '0')} sends itself {sig.name} {when}\n"
    if sig in (signal.SIGKILL, signal.SIGSTOP):
        said += "\r 50%|#####     | 1/2"  # a bar's frame cut off: not a line to quote
    sys.stderr.write(said)
    sys.stderr.flush()
    os.kill(os.getpid(), sig)


def _children() -> list[int]:
    pids: list[int] = []
    for task in Path(f"/proc/{os.getpid()}/task").glob("*"):
        pids += [int(p) for p in (task / "children").read_text().split()]
    return sorted(pids)


@hookimpl
def on_step_begin(state: Any) -> None:
    """Raise, die, freeze or kill a data worker at the configured step."""
    step = state.global_step
    time.sleep(float(os.environ.get("HT_STEP_DELAY_S", "0")))
    fail_at = _env_int("HT_FAIL_AT_STEP")
    if fail_at is not None and step == fail_at:
        if os.environ.get("RANK", "0") == os.environ.get("HT_FAIL_RANK", "0"):
            raise RuntimeError(f"chaos: injected failure at step {step + 1}")
    if step == _env_int("HT_KILL_AT_STEP") and _this_rank(None):
        _signal_self(_signal(), f"as step {step + 1} begins")
    if step == _env_int("HT_KILL_WORKER_AT_STEP") and _this_rank("0"):
        os.kill(_children()[0], signal.SIGKILL)
        time.sleep(1)  # the loader notices (SIGCHLD) before this step's collectives


@hookimpl
def on_save_checkpoint(state: Any, plugin_state: dict[str, Any]) -> None:
    """Signal this rank while the checkpoint of the configured step is being written."""
    if state.global_step == _env_int("HT_SIGNAL_IN_SAVE_STEP") and _this_rank("0"):
        _signal_self(_signal(), f"while step-{state.global_step} is saved")
        time.sleep(0.5)  # the handler runs; the write goes on
