"""``hyper-train plot``: loss, learning rate and throughput curves of a run."""

from __future__ import annotations

import json
from pathlib import Path

from ..errors import UserError


def read_metrics(output_dir: Path) -> list[dict]:
    """The train records of ``metrics.jsonl`` (eval records left out)."""
    path = output_dir / "metrics.jsonl"
    if not path.is_file():
        raise UserError(f"{path}: no metrics (is {output_dir} a run's output_dir?)")
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [r for r in rows if "loss" in r]


def plot_metrics(output_dir: Path, out: Path | None = None) -> Path:
    """Draw the curves to ``out`` (default ``output_dir/metrics.png``)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:
        raise UserError("plot needs matplotlib: pip install 'hyper-train[plot]'") from exc
    rows = read_metrics(output_dir)
    if not rows:
        raise UserError(f"{output_dir}/metrics.jsonl has no logged steps")
    steps = [r["step"] for r in rows]
    fig, axes = plt.subplots(3, 1, figsize=(7, 8), sharex=True)
    for ax, key, label in zip(
        axes, ("loss", "lr", "tokens_per_s"), ("loss", "learning rate", "tokens/s"), strict=True
    ):
        ax.plot(steps, [r.get(key) for r in rows])
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
    axes[-1].set_xlabel("step")
    fig.suptitle(str(output_dir))
    fig.tight_layout()
    out = out or output_dir / "metrics.png"
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out
