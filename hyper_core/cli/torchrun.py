"""``python -m hyper_core.cli.torchrun``: ``torch.distributed.run`` without its own report of
failed ranks (its log lines and the ``ChildFailedError`` traceback).

The launcher (:func:`hyper_core.cli.launch.launch_torchrun`) names failed ranks once, from
the status files the ranks write; torchrun's report would repeat each error in a traceback.
A rank killed by a signal writes no status: the ranks torchrun saw exit non-zero are written
to the launcher's status folder (``torchrun-failures.json``) for its report, and named here
when there is no launcher. ``--debug`` runs the plain ``torch.distributed.run`` instead.
"""

from __future__ import annotations

import json
import logging
import os
import sys
from pathlib import Path
from typing import Any


def main(argv: list[str]) -> int:
    """Run torchrun with ``argv``; exit code 1 when a rank failed, 128 + N when torchrun got
    signal N (it passed the signal on to the ranks, as SIGTERM stops them, and waited)."""
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import main as torchrun_main

    logging.getLogger("torch.distributed.elastic.multiprocessing.api").setLevel(logging.CRITICAL)
    sys.argv[0] = "torchrun"
    try:
        torchrun_main(argv)
    except ChildFailedError as exc:
        if not _record_failures(exc.failures):
            rank, failure = exc.get_first_failure()
            if failure.exitcode < 0:
                print(
                    f"hyper-train: rank {rank} was killed by {failure.signal_name()}",
                    file=sys.stderr,
                )
        return 1
    except SignalException as exc:  # torchrun itself was signalled; it stopped the ranks
        return 128 + int(exc.sigval)
    return 0


def _record_failures(failures: dict[int, Any]) -> bool:
    """Write ``rank -> {exitcode, signal, pid, time}`` for the launcher; whether there is one."""
    from .launch import DEATHS_FILE, STATUS_DIR_ENV

    folder = os.environ.get(STATUS_DIR_ENV)
    if not folder:
        return False
    records = {
        rank: {
            "local_rank": f.local_rank,
            "pid": f.pid,
            "exitcode": f.exitcode,
            "signal": f.signal_name() if f.exitcode < 0 else None,
            "time": f.timestamp,
        }
        for rank, f in failures.items()
    }
    try:
        (Path(folder) / DEATHS_FILE).write_text(json.dumps(records))
    except OSError:
        return False
    return True


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
