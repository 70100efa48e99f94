"""How a rank reports to the launcher that started it: its heartbeat while it trains and how it
ended, as small JSON files in ``$HYPER_TRAIN_STATUS_DIR`` (set by the launcher only).

``rank-R.json``: how rank R ended (``ok``, ``stopped`` or ``failed``, the error, whether the
error is a consequence of another rank's failure). ``rank-R.crash``: the faulthandler report of
a native crash (SIGSEGV, SIGABRT, ...). ``rank-R.beat``: the rank's pid, its last
finished step, its stage and the wall time of its last beat (written by the step watchdog's
thread, so it goes stale only when the whole process is frozen or gone).
"""

from __future__ import annotations

import faulthandler
import gc
import json
import os
import re
import signal
import threading
import time
from pathlib import Path
from typing import IO, Any

#: Set by the launcher for its ranks: the folder of their status and heartbeat files.
STATUS_DIR_ENV = "HYPER_TRAIN_STATUS_DIR"

#: Words of the errors a collective raises when a peer is gone or late: on a rank that sees
#: one, the failure most likely started elsewhere.
_COLLECTIVE_MARKERS = (
    "gloo",
    "nccl",
    "connection reset",
    "connection closed",
    "connection refused",
    "broken pipe",
    "timed out",
    "timeout",
    "processgroup",
    "socket",
)

_WORKER_KILLED = re.compile(r"DataLoader worker \(pid (\d+)\) is killed by signal: ([^.]+)\.")
_WORKER_EXITED = re.compile(
    r"DataLoader worker \(pid\(?s?\)? ?(\d+)[^)]*\) exited unexpectedly(?: with exit code (-?\d+))?"
)


def beat_interval(stall_timeout_s: float | None) -> float:
    """Seconds between a rank's heartbeats: often enough that a frozen rank's beat is stale
    well before the others' stall timeout fires."""
    return min(5.0, stall_timeout_s / 4) if stall_timeout_s else 5.0


#: Stages of a step in progress (before them, the step counted is the next one; after them,
#: in ``log``, ``eval`` and ``checkpoint``, the step that just finished).
STEP_STAGES = ("data", "step")


def step_of(finished: int, stage: str) -> int:
    """The step a rank works on: the next one while it reads data or steps, else the one it
    finished (logging, evaluating or saving it)."""
    return finished + 1 if stage in STEP_STAGES else finished


def status_dir() -> Path | None:
    """The launcher's status folder for this rank, if a launcher started it."""
    path = os.environ.get(STATUS_DIR_ENV)
    return Path(path) if path and "RANK" in os.environ else None


def _write_json(path: Path, record: dict[str, Any]) -> bool:
    tmp = path.with_name(f"{path.name}.{threading.get_ident()}.tmp")  # two threads may write
    try:
        tmp.write_text(json.dumps(record))
        os.replace(tmp, path)
    except OSError:
        return False
    return True


def write_status(
    status: str, exc: BaseException | None = None, *, error: str | None = None, **extra: Any
) -> bool:
    """Under the launcher: record how this rank ended (``ok``, ``stopped``, ``failed``);
    whether it was recorded. The error is ``error``, else :func:`describe_error` of ``exc``."""
    from ..errors import UserError

    folder = status_dir()
    if folder is None:
        return False
    consequence = False
    if error is None and exc is not None:
        error, consequence = describe_error(exc)
    record = {
        "rank": int(os.environ["RANK"]),
        "local_rank": int(os.environ.get("LOCAL_RANK", "0")),
        "status": status,
        "error": error,
        "consequence": consequence,
        "user_error": isinstance(exc, UserError),
        "time": time.time(),
        **extra,
    }
    return _write_json(folder / f"rank-{record['rank']}.json", record)


def record_crashes() -> IO[str] | None:
    """Under the launcher: a native crash's report (faulthandler: the fatal signal and every
    thread's Python stack) goes to ``rank-R.crash``, which the launcher prints with its report
    of how the rank died. Returns the open file, to be kept for the life of the process."""
    folder = status_dir()
    if folder is None:
        return None
    try:
        f = (folder / f"rank-{os.environ['RANK']}.crash").open("w")
    except OSError:
        return None
    faulthandler.enable(file=f, all_threads=True)
    return f


def write_beat(record: dict[str, Any]) -> None:
    """Under the launcher: this rank's heartbeat ``record`` (pid, step, stage, time added)."""
    folder = status_dir()
    if folder is not None:
        rank = int(os.environ["RANK"])
        _write_json(
            folder / f"rank-{rank}.beat",
            {
                "rank": rank,
                "local_rank": int(os.environ.get("LOCAL_RANK", "0")),
                "pid": os.getpid(),
                "beat": time.time(),
                **record,
            },
        )


def read_records(folder: Path, suffix: str) -> dict[int, dict[str, Any]]:
    """``rank -> record`` of the ``rank-R<suffix>`` files in ``folder`` (unreadable: left out)."""
    records = {}
    for f in folder.glob(f"rank-*{suffix}"):
        try:
            record = json.loads(f.read_text())
            records[int(record["rank"])] = record
        except (OSError, ValueError, KeyError, TypeError):
            continue
    return records


def describe_error(exc: BaseException) -> tuple[str, bool]:
    """``(one line, is a consequence)`` for an exception that ended this rank: a data-loader
    worker's death is named as such; a collective's error on a peer's loss is a consequence."""
    text = f"{type(exc).__name__}: {exc}"
    worker = _data_worker_death(str(exc))
    if worker is not None:
        return worker, False
    return text, is_collective_error(exc)


def reported_by_launcher(exc: BaseException) -> bool:
    """Whether the launcher's report says all there is to say about ``exc`` (no traceback):
    a collective's error on a lost peer, or a data worker's death."""
    return is_collective_error(exc) or _data_worker_death(str(exc)) is not None


def is_collective_error(exc: BaseException) -> bool:
    """Whether ``exc`` is what a collective raises when a peer failed or is late."""
    try:
        import torch.distributed as dist

        if isinstance(exc, dist.DistError):
            return True
    except (ImportError, AttributeError):
        pass
    if not isinstance(exc, RuntimeError | OSError | TimeoutError):
        return False
    message = str(exc).lower()
    return any(marker in message for marker in _COLLECTIVE_MARKERS)


def _signal_number(name: str) -> int | None:
    """The signal whose ``strsignal`` text (``Killed``) or name (``SIGKILL``) is ``name``."""
    for sig in signal.Signals:
        if name.strip() in (sig.name, signal.strsignal(sig)):
            return int(sig)
    return None


def _data_worker_death(message: str) -> str | None:
    """``data worker N of rank R died (signal S)`` for torch's DataLoader error, else None."""
    if m := _WORKER_KILLED.search(message):
        pid, number = int(m.group(1)), _signal_number(m.group(2))
        how = f"signal {number}" if number is not None else m.group(2)
    elif m := _WORKER_EXITED.search(message):
        pid = int(m.group(1))
        code = m.group(2)
        how = f"exit code {code}" if code is not None else "exited"
    else:
        return None
    worker = _worker_id(pid)
    rank = os.environ.get("RANK", "0")
    name = f"data worker {worker}" if worker is not None else f"a data worker (pid {pid})"
    return f"{name} of rank {rank} died ({how})"


def _worker_id(pid: int) -> int | None:
    """The DataLoader worker id of process ``pid`` among this process's live loader iterators,
    or as a :class:`StepLoader` recorded it (the trainer shuts its iterator down as the failure
    unwinds); found on the failure path only, torch keeps no pid → id map elsewhere."""
    try:
        from torch.utils.data.dataloader import _MultiProcessingDataLoaderIter

        from ..data.step_loader import StepLoader
    except ImportError:
        return None
    for obj in gc.get_objects():
        if type(obj) is _MultiProcessingDataLoaderIter:  # isinstance wakes lazy modules
            for i, worker in enumerate(getattr(obj, "_workers", [])):
                if getattr(worker, "pid", None) == pid:
                    return i
        elif type(obj) is StepLoader and pid in obj.worker_ids:
            return obj.worker_ids[pid]
    return None
