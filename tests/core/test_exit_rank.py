"""A torchrun rank ends through ``exit_rank``: its ``atexit`` handlers run and its buffered
output is written before ``os._exit`` skips the interpreter's finalisation."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from hyper_core.parallel.exit import is_torchrun_rank


def test_exit_rank_runs_atexit_handlers_flushes_and_keeps_the_code(tmp_path: Path) -> None:
    marker = tmp_path / "atexit.txt"
    script = textwrap.dedent(
        f"""
        import atexit, sys
        from pathlib import Path
        from hyper_core.parallel.exit import exit_rank

        atexit.register(lambda: Path({str(marker)!r}).write_text("ran"))
        sys.stdout.write("buffered, no newline")
        sys.stderr.write("err")
        exit_rank(3)
        print("not reached")
        """
    )
    proc = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=False
    )
    assert proc.returncode == 3, proc.stderr
    assert proc.stdout == "buffered, no newline" and proc.stderr == "err"
    assert marker.read_text() == "ran"


def test_only_torchrun_ranks_exit_early(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert not is_torchrun_rank()
    monkeypatch.setenv("LOCAL_RANK", "1")
    assert is_torchrun_rank()


@pytest.mark.parametrize("rank_env", [False, True])
def test_the_cli_keeps_its_exit_code_and_output_as_a_rank(rank_env: bool, tmp_path: Path) -> None:
    # under torchrun (LOCAL_RANK and WORLD_SIZE set) hyper-train ends through exit_rank
    env = {k: v for k, v in os.environ.items() if k != "LOCAL_RANK"}
    if rank_env:
        env.update(LOCAL_RANK="0", WORLD_SIZE="1", RANK="0")
    bad = tmp_path / "bad.toml"
    bad.write_text("[training]\nsteps = 0\n")
    proc = subprocess.run(
        [sys.executable, "-m", "hyper_core", "config", "validate", str(bad)],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        check=False,
    )
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.startswith("hyper-train: error: ") and "$.training" in proc.stderr
