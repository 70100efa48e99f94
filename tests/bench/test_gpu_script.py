"""``bench/gpu.sh`` cannot measure the wrong thing: without a CUDA torch it stops at once."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_without_cuda_it_exits_2_naming_the_python() -> None:
    env = {**os.environ, "PYTHON": sys.executable}
    proc = subprocess.run(
        ["bash", str(REPO / "bench" / "gpu.sh")], env=env, capture_output=True, text=True
    )
    assert proc.returncode == 2, proc.stderr
    assert "has no CUDA-enabled torch" in proc.stderr
    assert not (REPO / ".venv-gpu").exists()  # nothing installed before the check
