"""Startup: wall time of the fast commands, with every installed plugin, and no torch import."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from .runner import Ratio, Result

REPO = Path(__file__).resolve().parents[1]
COMMANDS = {
    "help": ["--help"],
    "plugins": ["plugins"],
    "config_validate": ["config", "validate", str(REPO / "configs" / "qwen2_5_vl_demo.toml")],
}
PROBE = (
    "import sys, time; t = time.perf_counter(); from hyper_core.cli import main\n"
    "try:\n    main({args!r})\nexcept SystemExit:\n    pass\n"
    "bad = [m for m in ('torch', 'transformers') if m in sys.modules]\n"
    "sys.stderr.write('IMPORTED=' + ','.join(bad) + '\\n')"
)


def _time(args: list[str]) -> tuple[float, str]:
    t0 = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-c", PROBE.format(args=args)],
        capture_output=True,
        text=True,
        cwd=REPO,
        env=dict(os.environ),
        check=False,
    )
    elapsed = time.perf_counter() - t0
    imported = next(
        (ln.split("=", 1)[1] for ln in proc.stderr.splitlines() if ln.startswith("IMPORTED=")), "?"
    )
    return elapsed, imported


def run(size: str = "full") -> Result:
    """Median of 5 (3 in CI) runs of each command, as a fresh process."""
    repeats = 3 if size == "ci" else 5
    result = Result("startup", "wall time of fast commands (fresh interpreter each)")
    from importlib.metadata import entry_points

    result.params["plugins"] = sorted(ep.name for ep in entry_points(group="hyper_train.plugins"))
    result.params["repeats"] = repeats
    for _ in range(repeats):
        for name, args in COMMANDS.items():
            elapsed, imported = _time(args)
            result.figure(name, "s").values.append(elapsed)
            result.params[f"{name}_imports_torch_or_transformers"] = imported or "none"
    budget = result.figure("goal", "s")
    budget.values.append(0.5)
    for name in COMMANDS:
        result.ratios[f"{name}_vs_0.5s"] = Ratio(name, "goal", "< 1")
    return result
