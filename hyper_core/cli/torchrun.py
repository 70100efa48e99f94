"""``python -m hyper_core.cli.torchrun``: ``torch.distributed.run`` without its own report of
failed ranks (its log lines and the ``ChildFailedError`` traceback).

The launcher (:func:`hyper_core.cli.launch.launch_torchrun`) names failed ranks once, from
the status files the ranks write; torchrun's report would repeat each error in a traceback.
Only a rank killed by a signal, which writes no status, is reported here. ``--debug`` runs the
plain ``torch.distributed.run`` instead.
"""

from __future__ import annotations

import logging
import sys


def main(argv: list[str]) -> int:
    """Run torchrun with ``argv``; exit code 1 when a rank failed."""
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import main as torchrun_main

    logging.getLogger("torch.distributed.elastic.multiprocessing.api").setLevel(logging.CRITICAL)
    sys.argv[0] = "torchrun"
    try:
        torchrun_main(argv)
    except ChildFailedError as exc:
        rank, failure = exc.get_first_failure()
        if failure.exitcode < 0:
            print(
                f"hyper-train: rank {rank} was killed by {failure.signal_name()}", file=sys.stderr
            )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
