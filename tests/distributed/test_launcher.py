"""The launcher's torchrun command line and exit codes (no processes started)."""

from __future__ import annotations

import argparse

import pytest

from hyper_core.cli.launch import QUIET_TORCHRUN, launcher_exit_code, torchrun_command
from hyper_core.errors import UserError


def _args(**kw: object) -> argparse.Namespace:
    base = dict(
        nproc_per_node=2,
        nnodes=None,
        node_rank=None,
        rdzv_endpoint=None,
        rdzv_id=None,
        config="c.toml",
        overrides=["--training.steps=3"],
        plugin=["mod_a"],
        debug=False,
        strict_plugins=True,
        trace_hooks=False,
    )
    base.update(kw)
    return argparse.Namespace(**base)


def test_single_node_is_standalone() -> None:
    cmd = torchrun_command(_args())
    assert cmd[1:4] == ["-m", QUIET_TORCHRUN, "--nproc-per-node=2"]
    assert torchrun_command(_args(debug=True))[1:3] == ["-m", "torch.distributed.run"]
    assert "--standalone" in cmd
    tail = cmd[cmd.index("hyper_core") - 1 :]
    assert tail == [
        "-m", "hyper_core", "run", "c.toml", "--training.steps=3",
        "--plugin", "mod_a", "--strict-plugins",
    ]  # fmt: skip


def test_multi_node_options_pass_through() -> None:
    cmd = torchrun_command(
        _args(nnodes="2", node_rank=1, rdzv_endpoint="host:29400", rdzv_id="job7")
    )
    for part in (
        "--nnodes=2",
        "--node-rank=1",
        "--rdzv-backend=c10d",
        "--rdzv-endpoint=host:29400",
        "--rdzv-id=job7",
    ):
        assert part in cmd
    assert "--standalone" not in cmd


def test_multi_node_without_an_endpoint_is_a_user_error() -> None:
    with pytest.raises(UserError, match="--rdzv-endpoint"):
        torchrun_command(_args(nnodes="2"))


def _status(rank: int, status: str, t: float = 0.0, **kw: object) -> dict[str, object]:
    return {"rank": rank, "local_rank": rank, "status": status, "time": t, "error": None, **kw}


def test_exit_codes(capsys: pytest.CaptureFixture[str]) -> None:
    ok = {0: _status(0, "ok"), 1: _status(1, "stopped")}
    assert launcher_exit_code(0, ok, 2) == 0
    # torchrun itself signalled (non-zero) but every rank stopped cleanly: success.
    assert launcher_exit_code(1, ok, 2) == 0
    # A rank with no status (killed): failure, and named.
    assert launcher_exit_code(1, {0: _status(0, "ok")}, 2) == 1
    assert "local rank(s) 1" in capsys.readouterr().err
    failed = {
        0: _status(0, "failed", 2.0, error="RuntimeError: peer closed"),
        1: _status(1, "failed", 1.0, error="RuntimeError: boom"),
    }
    assert launcher_exit_code(1, failed, 2) == 1
    err = capsys.readouterr().err.splitlines()
    assert err[0] == "hyper-train: rank 1 (first) failed: RuntimeError: boom"
    user = {0: _status(0, "failed", error="ConfigError: bad", user_error=True)}
    assert launcher_exit_code(1, user, 1) == 2


def test_a_killed_rank_is_the_cause_and_lost_peers_its_consequences(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """torchrun saw rank 1 die by SIGKILL after rank 0 had already failed on the lost
    connection: rank 1 is still the cause, named with its step."""
    lost = "RuntimeError: [gloo/transport/tcp/pair.cc:537] Read error: Connection reset by peer"
    statuses = {0: _status(0, "failed", 1.0, error=lost, consequence=True)}
    deaths = {1: {"exitcode": -9, "signal": "SIGKILL", "time": 2.0}}
    beats = {1: {"rank": 1, "step": 46, "stage": "step", "beat": 0.0}}
    assert launcher_exit_code(1, statuses, 2, deaths=deaths, beats=beats) == 1
    assert capsys.readouterr().err.splitlines() == [
        "hyper-train: rank 1 was killed by signal 9 (SIGKILL: out of memory?) at step 47",
        f"hyper-train:   consequence: rank 0 failed: {lost}",
    ]


def test_the_causes_last_output_line_is_quoted_not_the_consequences(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The rank that started the failure: its last meaningful line (from the relay) follows
    its line; not a consequence's, nor that of a rank that reported its own error."""
    lost = "RuntimeError: [gloo/transport/tcp/pair.cc:537] Read error: Connection reset by peer"
    statuses = {0: _status(0, "failed", 1.0, error=lost, consequence=True)}
    deaths = {1: {"exitcode": -9, "signal": "SIGKILL", "time": 2.0}}
    last = {0: lost, 1: "hyper-train: reading shard 3 of /nfs/data"}
    assert launcher_exit_code(1, statuses, 2, deaths=deaths, last_lines=last) == 1
    assert capsys.readouterr().err.splitlines() == [
        "hyper-train: rank 1 was killed by signal 9 (SIGKILL: out of memory?)",
        "hyper-train:   last output of rank 1: hyper-train: reading shard 3 of /nfs/data",
        f"hyper-train:   consequence: rank 0 failed: {lost}",
    ]
    failed = {1: _status(1, "failed", 1.0, error="ValueError: bad row 7")}
    assert launcher_exit_code(1, failed, 2, last_lines={1: "hyper-train: step 3/8"}) == 1
    assert capsys.readouterr().err == "hyper-train: rank 1 failed: ValueError: bad row 7\n"


def test_a_frozen_rank_is_named_before_the_ranks_that_waited_for_it(
    capsys: pytest.CaptureFixture[str],
) -> None:
    waited = "stalled: no progress for 9 s at step 5, stage step"
    statuses = {0: _status(0, "failed", 1.0, error=waited, stalled=True)}
    beats = {1: {"rank": 1, "step": 4, "stage": "data", "beat": 0.5}}
    frozen = {1: "stopped by a signal (SIGSTOP?)"}
    assert launcher_exit_code(1, statuses, 2, beats=beats, frozen=frozen, killed={1}) == 1
    assert capsys.readouterr().err.splitlines() == [
        "hyper-train: rank 1 stalled at step 5 (data): its heartbeat stopped; the process was "
        "stopped by a signal (SIGSTOP?)",
        f"hyper-train:   consequence: rank 0 {waited}",
    ]


def test_a_native_crash_is_quoted_with_its_rank(capsys: pytest.CaptureFixture[str]) -> None:
    deaths = {0: {"exitcode": -11, "signal": "SIGSEGV", "time": 1.0}}
    crash = (
        "Fatal Python error: Segmentation fault\n\n"
        "Thread 0x2 (most recent call first):\n"
        '  File "threading.py", line 327 in wait\n\n'
        "Current thread 0x1 (most recent call first):\n"
        '  File "x.py", line 3 in f\n\n'
        "Extension modules: torch._C (total: 1)\n"
    )
    assert launcher_exit_code(1, {}, 2, deaths=deaths, crashes={0: crash}) == 1
    assert capsys.readouterr().err.splitlines() == [
        "hyper-train: rank 0 was killed by signal 11 (SIGSEGV: a crash in native code): "
        "Fatal Python error: Segmentation fault",
        "Current thread 0x1 (most recent call first):",
        '  File "x.py", line 3 in f',
    ]


def test_an_exit_code_without_a_status_is_named(capsys: pytest.CaptureFixture[str]) -> None:
    deaths = {1: {"exitcode": 3, "signal": None, "time": 1.0}}
    assert launcher_exit_code(1, {0: _status(0, "stopped")}, 2, deaths=deaths) == 1
    assert capsys.readouterr().err == "hyper-train: rank 1 exited with code 3 without saying why\n"


def test_max_restarts_restarts_failed_launches_from_latest(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A failed launch (1) is started again with ``--checkpoint.resume=auto``; a user error (2),
    a clean end (0) or a failure after a stop signal is not."""
    from hyper_core.cli import launch

    def run(codes: list[int], restarts: int) -> tuple[int, list[list[str]]]:
        calls: list[list[str]] = []

        def once(args: argparse.Namespace, stall: float | None) -> int:
            calls.append(list(args.overrides))
            return codes[len(calls) - 1]

        monkeypatch.setattr(launch, "_launch_once", once)
        return launch.launch_torchrun(_args(), 60, restarts), calls

    auto = ["--training.steps=3", "--checkpoint.resume=auto"]
    assert run([1, 1, 0], 3) == (0, [["--training.steps=3"], auto, auto])
    assert capsys.readouterr().err.splitlines() == [
        "hyper-train: restarting the ranks (1 of 3) from the latest checkpoint",
        "hyper-train: restarting the ranks (2 of 3) from the latest checkpoint",
    ]
    assert run([1, 1], 1) == (1, [["--training.steps=3"], auto])
    assert run([2], 3)[0] == 2 and run([0], 3)[0] == 0
    assert run([launch._SIGNALLED], 3) == (1, [["--training.steps=3"]])
