"""Running hyper-train and torchrun in subprocesses from a test (clean rank environment)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path


def subprocess_env(importable: Sequence[Path] = (), **extra: str) -> dict[str, str]:
    """A clean environment for rank processes: no inherited rank or rendezvous variables, one
    thread each, the ``importable`` folders on ``PYTHONPATH``; ``extra`` set last."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RANK", "LOCAL_", "WORLD_"))}
    env.pop("MASTER_ADDR", None)
    env.pop("MASTER_PORT", None)
    env["OMP_NUM_THREADS"] = "1"
    env["PYTHONPATH"] = os.pathsep.join([*map(str, importable), env.get("PYTHONPATH", "")])
    env.update(extra)
    return env


def hyper_train(
    args: Sequence[str],
    *,
    importable: Sequence[Path] = (),
    timeout: float = 300,
    **env: str,
) -> subprocess.CompletedProcess[str]:
    """``python -m hyper_core ARGS`` in a subprocess (``env`` added); output captured."""
    return subprocess.run(
        [sys.executable, "-m", "hyper_core", *args],
        env=subprocess_env(importable, **env),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def torchrun(
    script: Path,
    args: Sequence[str],
    nproc: int = 2,
    *,
    importable: Sequence[Path] = (),
    timeout: float = 600,
) -> subprocess.CompletedProcess[str]:
    """``python -m torch.distributed.run --standalone --nproc-per-node N SCRIPT ARGS``."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    cmd += [f"--nproc-per-node={nproc}", str(script), *args]
    return subprocess.run(
        cmd,
        env=subprocess_env(importable),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
