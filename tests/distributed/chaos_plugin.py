"""A test plugin (``--plugin chaos_plugin``) that injects failures, driven by env variables.

``HT_FAIL_RANK`` + ``HT_FAIL_AT_STEP``: that rank raises in ``on_step_begin`` when
``global_step`` equals the step (``2`` → while step 3 begins).
``HT_KILL_AT_STEP``: the process SIGKILLs itself in ``on_step_begin`` at that ``global_step``.
Imports no torch.
"""

from __future__ import annotations

import os
import signal
from typing import Any

from hyper_core.hookspecs import hookimpl


@hookimpl
def on_step_begin(state: Any) -> None:
    """Raise or die at the configured step."""
    step = state.global_step
    fail_at = os.environ.get("HT_FAIL_AT_STEP")
    if fail_at is not None and step == int(fail_at):
        if os.environ.get("RANK", "0") == os.environ.get("HT_FAIL_RANK", "0"):
            raise RuntimeError(f"chaos: injected failure at step {step + 1}")
    kill_at = os.environ.get("HT_KILL_AT_STEP")
    if kill_at is not None and step == int(kill_at):
        os.kill(os.getpid(), signal.SIGKILL)
