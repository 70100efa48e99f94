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
from typing import Any, NamedTuple

from ..errors import UserError
from ..parallel.rank_output import OutputRelay
from ..parallel.rank_status import (
    STATUS_DIR_ENV,
    beat_interval,
    read_records,
    step_of,
    write_status,
)

__all__ = ["QUIET_TORCHRUN", "STATUS_DIR_ENV", "launch_torchrun", "write_status"]


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


#: How a signal that killed a rank is explained.
_SIGNAL_HINTS = {
    "SIGKILL": "out of memory?",
    "SIGSEGV": "a crash in native code",
    "SIGBUS": "a crash in native code, or shared memory full?",
    "SIGABRT": "aborted by native code",
    "SIGTERM": "terminated",
    "SIGINT": "interrupted",
    "SIGHUP": "terminal closed",
}

#: A frozen process's state letter in ``/proc/PID/stat``, explained.
_PROCESS_STATES = {
    "T": "stopped by a signal (SIGSTOP?)",
    "t": "stopped by a debugger",
    "D": "in uninterruptible I/O (a hung file system or device?)",
    "Z": "exited",
}

#: Signals that stop a launch: the first stops every rank after its step, a second forces.
STOP_SIGNALS = ("SIGTERM", "SIGINT", "SIGHUP")


def _process_state(pid: int) -> str | None:
    """``/proc/PID/stat``'s state letter, or None when the process is gone (or not Linux)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return None


def _signal_text(number: int) -> str:
    import signal

    try:
        name = signal.Signals(number).name
    except ValueError:
        return f"signal {number}"
    hint = _SIGNAL_HINTS.get(name)
    return f"signal {number} ({name}{': ' + hint if hint else ''})"


def _die_with_parent() -> None:
    """In torchrun's process: SIGTERM it when the launcher dies (it runs in its own session,
    so nothing else would tell it)."""
    import ctypes
    import signal

    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


class _Supervisor:
    """One launch: torchrun in its own session, the stop signals, the stall backstop."""

    def __init__(self, cmd: list[str], status_dir: Path, stall_timeout_s: float | None) -> None:
        self.cmd = cmd
        self.status_dir = status_dir
        self.stall_timeout_s = stall_timeout_s
        self.proc: subprocess.Popen[bytes] | None = None
        self.first_signal_at: float | None = None
        self.forced: int | None = None
        #: Ranks the launcher ended after a stall, and what their state was then.
        self.frozen: dict[int, str] = {}
        self.killed: set[int] = set()
        self._stall_seen_at: float | None = None
        #: Ranks sent the stop (a rank torchrun starts after the signal gets it too).
        self.stopped: set[int] = set()

    def rank_pids(self) -> list[int]:
        assert self.proc is not None
        return _child_pids(self.proc.pid)

    def _signal_ranks(self, signum: int) -> None:
        for pid in self.rank_pids():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signum)
            self.stopped.add(pid)

    def on_signal(self, signum: int, frame: Any) -> None:
        """First stop signal: every rank stops after its step and saves (SIGTERM to each, as
        however it arrived); one more than a second later: kill the ranks now."""
        import signal
        import time

        now = time.monotonic()
        name = signal.Signals(signum).name
        if self.first_signal_at is None:
            self.first_signal_at = now
            print(
                f"hyper-train: received {name}: every rank stops after its current step and "
                "saves a checkpoint (a second signal forces the exit without saving)",
                file=sys.stderr,
                flush=True,
            )
            self._signal_ranks(signal.SIGTERM)
        elif now - self.first_signal_at > 1.0 and self.forced is None:
            self.forced = signum
            print(f"hyper-train: received {name} again: forcing the exit", file=sys.stderr)
            self._signal_ranks(signal.SIGKILL)

    def run(self, env: dict[str, str]) -> int:
        """Start torchrun and supervise it to its end; its exit code."""
        import signal

        self.proc = subprocess.Popen(
            self.cmd, env=env, start_new_session=True, preexec_fn=_die_with_parent
        )
        sigs = [getattr(signal, name) for name in STOP_SIGNALS]
        old = {sig: signal.signal(sig, self.on_signal) for sig in sigs}
        try:
            while True:
                try:
                    return self.proc.wait(timeout=0.5)
                except subprocess.TimeoutExpired:
                    if self.first_signal_at is not None and self.forced is None:
                        if set(self.rank_pids()) - self.stopped:
                            self._signal_ranks(signal.SIGTERM)
                    self._check_stall()
        finally:
            if self.proc.poll() is None:  # an exception here: leave no ranks behind
                self._signal_ranks(signal.SIGKILL)
                self.proc.kill()
                self.proc.wait()
            for sig, handler in old.items():
                signal.signal(sig, handler)

    def _check_stall(self) -> None:
        """A rank's watchdog reported a stall, or a rank's heartbeat stopped (the process is
        frozen, so its watchdog can't fire): after a grace for the others' stack dumps, end
        every local rank."""
        import signal
        import time

        if not self.stall_timeout_s:
            return
        statuses = read_records(self.status_dir, ".json")
        beats = read_records(self.status_dir, ".beat")
        now = time.time()
        interval = beat_interval(self.stall_timeout_s)
        stale = {
            rank: beat
            for rank, beat in beats.items()
            if now - beat["beat"] > self.stall_timeout_s + 2 * interval
            and rank not in statuses
            and _process_state(int(beat["pid"])) not in (None, "Z")
        }
        reported = any(s.get("stalled") for s in statuses.values())
        if not (reported or stale):
            return
        if self._stall_seen_at is None:
            self._stall_seen_at = time.monotonic()
        if time.monotonic() - self._stall_seen_at < 2 * interval and not stale:
            return
        for rank, beat in beats.items():
            if rank in statuses:
                continue
            state = _process_state(int(beat["pid"]))
            if state is None or state == "Z":
                continue
            if now - beat["beat"] > 2 * interval:
                self.frozen[rank] = _PROCESS_STATES.get(state, f"in state {state}")
            self.killed.add(rank)
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(beat["pid"]), signal.SIGKILL)


def launch_torchrun(
    args: argparse.Namespace, stall_timeout_s: float | None = None, max_restarts: int = 0
) -> int:
    """Re-run this command under ``torch.distributed.run`` with N processes per node.

    torchrun runs in a session of its own, so a signal reaches the ranks one way only: SIGINT,
    SIGTERM or SIGHUP to this launcher (or its process group) is sent to every local rank as
    SIGTERM (they finish the step, save a checkpoint and exit 0); a second one kills them. The
    exit code is 0 when all ranks ended cleanly, else non-zero with one report naming the
    rank whose failure came first (:func:`launcher_exit_code`). A failed launch (exit 1, no
    signal received) is started again up to ``max_restarts`` times, resuming from the latest
    checkpoint (``--checkpoint.resume=auto``), each failure reported first.
    """
    code = _launch_once(args, stall_timeout_s)
    for restart in range(1, max_restarts + 1):
        if code != 1:  # done, stopped, a user error, forced or signalled: not restarted
            break
        print(
            f"hyper-train: restarting the ranks ({restart} of {max_restarts}) from the latest "
            "checkpoint",
            file=sys.stderr,
            flush=True,
        )
        resumed = argparse.Namespace(
            **{**vars(args), "overrides": [*args.overrides, "--checkpoint.resume=auto"]}
        )
        code = _launch_once(resumed, stall_timeout_s)
    return 1 if code == _SIGNALLED else code


#: :func:`_launch_once`'s code for a launch that failed after a stop signal (not restarted).
_SIGNALLED = -1


def _launch_once(args: argparse.Namespace, stall_timeout_s: float | None) -> int:
    """One torchrun launch, supervised and reported (see :func:`launch_torchrun`)."""
    import tempfile

    cmd = torchrun_command(args)
    with tempfile.TemporaryDirectory(prefix="hyper-train-status-") as status_dir:
        env = dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"))
        env[STATUS_DIR_ENV] = status_dir
        folder = Path(status_dir)
        relay = OutputRelay.open(folder, args.nproc_per_node, sys.stdout.buffer, sys.stderr.buffer)
        supervisor = _Supervisor(cmd, folder, stall_timeout_s)
        try:
            rc = supervisor.run(env)
        finally:
            if relay is not None:
                relay.close()
        statuses = read_records(folder, ".json")
        beats = read_records(folder, ".beat")
        deaths = _read_deaths(folder)
        last_lines = _last_lines(relay, statuses, beats, deaths)
        crashes = {
            int(f.name.split("-")[1].split(".")[0]): f.read_text(errors="replace")
            for f in folder.glob("rank-*.crash")
            if f.stat().st_size
        }
    if supervisor.forced is not None:
        return 128 + supervisor.forced
    code = launcher_exit_code(
        rc,
        statuses,
        args.nproc_per_node,
        deaths=deaths,
        beats=beats,
        frozen=supervisor.frozen,
        killed=supervisor.killed,
        crashes=crashes,
        last_lines=last_lines,
    )
    return _SIGNALLED if code == 1 and supervisor.first_signal_at is not None else code


#: Written by :mod:`hyper_core.cli.torchrun` into the status folder: ranks that torchrun saw
#: exit non-zero (``rank -> {exitcode, signal, time}``).
DEATHS_FILE = "torchrun-failures.json"


def _last_lines(relay: OutputRelay | None, *records: dict[int, dict[str, Any]]) -> dict[int, str]:
    """``rank -> its meaningful last line of output`` (the relay knows local ranks; the
    ranks' records say which rank each is)."""
    if relay is None:
        return {}
    lines = {}
    for by_rank in records:
        for rank, record in by_rank.items():
            line = relay.last_line(int(record.get("local_rank", -1)))
            if line is not None:
                lines[rank] = line
    return lines


def _read_deaths(folder: Path) -> dict[int, dict[str, Any]]:
    try:
        raw = json.loads((folder / DEATHS_FILE).read_text())
    except (OSError, ValueError):
        return {}
    return {int(rank): record for rank, record in raw.items()}


#: How a rank's failure ranks in the report, first first: a frozen rank (it stopped while the
#: others waited), a cause (an error of its own, a signal), a stall (waiting for a peer?), a
#: consequence (a collective's error on a lost peer), a rank the launcher ended.
_FROZEN, _CAUSE, _STALLED, _CONSEQUENCE, _ENDED = range(-1, 4)


class _Failure(NamedTuple):
    rank: int
    order: int
    time: float
    how: str
    user_error: bool = False
    #: Whether the rank said nothing of its own (its last line of output may).
    silent: bool = False


def _where(beat: dict[str, Any] | None) -> str:
    """`` at step N`` (the step it was working on) and its stage, from a rank's heartbeat."""
    if not beat:
        return ""
    stage = beat.get("stage")
    detail = f" ({stage})" if stage and stage != "step" else ""
    return f" at step {step_of(int(beat['step']), str(stage))}{detail}"


def launcher_exit_code(
    rc: int,
    statuses: dict[int, dict[str, Any]],
    nproc: int,
    *,
    deaths: dict[int, dict[str, Any]] | None = None,
    beats: dict[int, dict[str, Any]] | None = None,
    frozen: dict[int, str] | None = None,
    killed: set[int] | frozenset[int] = frozenset(),
    crashes: dict[int, str] | None = None,
    last_lines: dict[int, str] | None = None,
) -> int:
    """0 when every local rank ended cleanly (also when torchrun itself was signalled and so
    exits non-zero), 2 when the ranks failed on a user error, else 1.

    A failure prints one report: the rank whose failure started it first, with how (its
    error, the signal that killed it, its stall), then the others' failures as its
    consequences (a collective's error on a lost peer, a rank the launcher ended). An error
    several ranks share is said once. A native crash's report (``crashes``, rank -> text) is
    quoted after its rank's line, and so is the last meaningful line of output of a rank that
    started the failure without saying why (killed, frozen; ``last_lines``, rank -> line).
    """
    deaths, beats, frozen, crashes = deaths or {}, beats or {}, frozen or {}, crashes or {}
    last_lines = last_lines or {}
    failures: list[_Failure] = []
    for rank, state in frozen.items():
        beat = beats.get(rank, {})
        how = f"stalled{_where(beat)}: its heartbeat stopped; the process was {state}"
        failures.append(_Failure(rank, _FROZEN, float(beat.get("beat", 0.0)), how, silent=True))
    for rank, record in statuses.items():
        if record["status"] != "failed" or rank in frozen:
            continue
        user_error = bool(record.get("user_error"))
        if record.get("stalled"):
            order, how = _STALLED, record["error"]
        else:
            order = _CONSEQUENCE if record.get("consequence") else _CAUSE
            where = _where(beats.get(rank)) if order == _CAUSE and not user_error else ""
            how = f"failed{where}: {record['error']}"
        failures.append(_Failure(rank, order, record["time"], how, user_error))
    for rank, death in deaths.items():
        if rank in statuses or rank in frozen:
            continue
        code, where = int(death["exitcode"]), _where(beats.get(rank))
        if code < 0:
            how = f"was killed by {_signal_text(-code)}{where}"
            if crashes.get(rank, "").strip():
                how += ": " + _crash_excerpt(crashes[rank])
        else:
            how = f"exited with code {code}{where} without saying why"
        order = _ENDED if rank in killed else _CAUSE
        time = float(death.get("time", 0.0))
        failures.append(_Failure(rank, order, time, how, silent=True))
    failures.sort(key=lambda f: (f.order, f.time))
    printed: set[str] = set()
    causes = sum(1 for f in failures if f.order <= _CAUSE)
    for i, f in enumerate(failures):
        if f.how in printed:
            continue  # the same error on another rank: said once
        printed.add(f.how)
        if f.order > _CAUSE and failures[0].order < f.order:
            print(f"hyper-train:   consequence: rank {f.rank} {_short(f.how)}", file=sys.stderr)
            continue
        first = " (first)" if i == 0 and causes > 1 else ""
        print(f"hyper-train: rank {f.rank}{first} {f.how}", file=sys.stderr)
        last = last_lines.get(f.rank) if f.silent else None
        if last:
            print(f"hyper-train:   last output of rank {f.rank}: {_short(last)}", file=sys.stderr)
    if failures:
        return 2 if all(f.user_error for f in failures) else 1
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


def _crash_excerpt(report: str, limit: int = 30) -> str:
    """A faulthandler report's first line and the crashed thread's stack (the others, and
    the list of extension modules, are left out)."""
    lines = report.strip().splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith("Current thread")), None)
    stack: list[str] = []
    if start is not None:
        for line in lines[start:]:
            if not line.strip():
                break
            stack.append(line)
    return "\n".join([lines[0], *stack[:limit]])


def _short(text: str, limit: int = 240) -> str:
    """``text`` on one line, at most ``limit`` characters."""
    line = " ".join(text.split())
    return line if len(line) <= limit else line[: limit - 1] + "…"
