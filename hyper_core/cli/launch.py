"""The launcher: ``hyper-train run --nproc-per-node N`` re-runs itself under torchrun and
supervises the ranks.

Each rank writes how it ended to ``$HYPER_TRAIN_STATUS_DIR/rank-R.json``
(:func:`write_status`); the launcher turns those into one exit code and one report
(:func:`launcher_exit_code`).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from ..errors import UserError

#: Set by the launcher for its ranks: where each rank writes how it ended (rank-R.json).
STATUS_DIR_ENV = "HYPER_TRAIN_STATUS_DIR"


#: The module that runs torchrun without its own failure report (see its docstring).
QUIET_TORCHRUN = "hyper_core.cli.torchrun"


def torchrun_command(args: argparse.Namespace) -> list[str]:
    """The ``torch.distributed.run`` command line that re-runs this ``run`` on every rank
    (torchrun's own failure report only with ``--debug``)."""
    torchrun = ["-m", "torch.distributed.run" if args.debug else QUIET_TORCHRUN]
    cmd = [sys.executable, *torchrun, f"--nproc-per-node={args.nproc_per_node}"]
    if args.rdzv_endpoint:
        cmd += ["--rdzv-backend=c10d", f"--rdzv-endpoint={args.rdzv_endpoint}"]
        if args.nnodes:
            cmd.append(f"--nnodes={args.nnodes}")
        if args.rdzv_id:
            cmd.append(f"--rdzv-id={args.rdzv_id}")
    elif args.nnodes in (None, "1", "1:1"):
        cmd.append("--standalone")
    else:
        raise UserError(
            f"--nnodes {args.nnodes} needs --rdzv-endpoint HOST:PORT (the same on every node)"
        )
    if args.node_rank is not None:
        cmd.append(f"--node-rank={args.node_rank}")
    cmd += ["-m", "hyper_core", "run", args.config, *args.overrides]
    for module in args.plugin:
        cmd += ["--plugin", module]
    for flag in ("debug", "strict_plugins", "trace_hooks"):
        if getattr(args, flag):
            cmd.append("--" + flag.replace("_", "-"))
    return cmd


def _child_pids(pid: int) -> list[int]:
    """Direct children of ``pid`` (Linux ``/proc``; empty elsewhere)."""
    children: list[int] = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            children += [int(c) for c in (task / "children").read_text().split()]
        except OSError:
            continue
    if children:
        return children
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[1]) == pid:
            children.append(int(stat.parent.name))
    return children


def read_statuses(status_dir: Path) -> dict[int, dict[str, Any]]:
    statuses = {}
    for f in status_dir.glob("rank-*.json"):
        try:
            record = json.loads(f.read_text())
        except (OSError, ValueError):
            continue
        statuses[int(record["rank"])] = record
    return statuses


def launcher_exit_code(rc: int, statuses: dict[int, dict[str, Any]], nproc: int) -> int:
    """0 when every local rank ended cleanly (also when torchrun itself was signalled and so
    exits non-zero), 2 when the ranks failed on a user error, else 1; names failed ranks
    (an error several ranks share once, with the first rank that failed)."""
    failed = sorted(
        (r for r in statuses.values() if r["status"] == "failed"), key=lambda r: r["time"]
    )
    printed: set[str] = set()
    for i, record in enumerate(failed):
        if record["error"] in printed:
            continue  # the same error on another rank: said once
        printed.add(record["error"])
        first = " (first)" if i == 0 and len(failed) > 1 else ""
        print(
            f"hyper-train: rank {record['rank']}{first} failed: {record['error']}",
            file=sys.stderr,
        )
    if failed:
        return 2 if all(r.get("user_error") for r in failed) else 1
    local = {int(r.get("local_rank", -1)) for r in statuses.values()}
    missing = [str(i) for i in range(nproc) if i not in local]
    if rc == 0:
        return 0
    if not missing:
        return 0  # every rank finished or stopped cleanly
    print(
        f"hyper-train: local rank(s) {', '.join(missing)} exited without finishing "
        f"(killed by a signal or out of memory?); torchrun exit code {rc}",
        file=sys.stderr,
    )
    return 1


def launch_torchrun(args: argparse.Namespace) -> int:
    """Re-run this command under ``torch.distributed.run`` with N processes per node.

    SIGTERM to this launcher goes straight to the ranks (they save a checkpoint and exit 0);
    SIGINT is left to the terminal, which delivers it to every process of the group. The exit
    code is 0 when all ranks ended cleanly, else non-zero with the failed ranks named.
    """
    import signal
    import tempfile

    cmd = torchrun_command(args)
    with tempfile.TemporaryDirectory(prefix="hyper-train-status-") as status_dir:
        env = dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"))
        env[STATUS_DIR_ENV] = status_dir
        proc = subprocess.Popen(cmd, env=env)

        def forward(signum: int, frame: Any) -> None:
            if signum == signal.SIGTERM:
                for pid in _child_pids(proc.pid) or [proc.pid]:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signum)

        old = {sig: signal.signal(sig, forward) for sig in (signal.SIGTERM, signal.SIGINT)}
        try:
            rc = proc.wait()
        finally:
            for sig, handler in old.items():
                signal.signal(sig, handler)
        statuses = read_statuses(Path(status_dir))
    return launcher_exit_code(rc, statuses, args.nproc_per_node)


def write_status(status: str, exc: BaseException | None = None) -> bool:
    """Under the launcher: record how this rank ended (``ok``, ``stopped``, ``failed``);
    whether it was recorded."""
    import time

    status_dir = os.environ.get(STATUS_DIR_ENV)
    if not status_dir or "RANK" not in os.environ:
        return False
    record = {
        "rank": int(os.environ["RANK"]),
        "local_rank": int(os.environ.get("LOCAL_RANK", "0")),
        "status": status,
        "error": f"{type(exc).__name__}: {exc}" if exc is not None else None,
        "user_error": isinstance(exc, UserError),
        "time": time.time(),
    }
    try:
        (Path(status_dir) / f"rank-{record['rank']}.json").write_text(json.dumps(record))
    except OSError:
        return False
    return True
