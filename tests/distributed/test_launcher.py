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
