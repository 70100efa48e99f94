"""Ending a torchrun rank's process without Python's interpreter finalisation.

Why: on gloo (torch 2.13) a process group that ran a functional collective (DTensor's
redistributions, e.g. the gradient-norm all-reduce under FSDP2) outlives
``destroy_process_group()``, with its worker threads. A C++ thread that drops the last
reference to a tensor during finalisation must take the GIL to free its Python object, and a
thread that asks for the GIL then is ended by Python, which C++ answers with
``terminate called without an active exception``: now and then a run that trained and saved
everything exits -6, and torchrun reports it failed. :func:`exit_rank` runs the ``atexit``
handlers (logging's flush, multiprocessing's clean-up of data workers) and flushes stdio
while the interpreter is whole, then ends the process with ``os._exit``.
"""

from __future__ import annotations

import atexit
import os
import sys
from typing import NoReturn


def exit_rank(code: int) -> NoReturn:
    """End this rank's process with ``code`` now (see the module doc); call it last."""
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # closed or gone: nothing left to save
            pass
    os._exit(code)


def is_torchrun_rank() -> bool:
    """Whether this process is a rank started by torchrun."""
    return "LOCAL_RANK" in os.environ and "WORLD_SIZE" in os.environ
