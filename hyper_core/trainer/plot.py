"""``hyper-train plot``: loss, learning rate and throughput curves of a run, with the held-out
loss and, when evaluated, token accuracy and answer accuracy per question type."""

from __future__ import annotations

import json
from pathlib import Path

from ..errors import UserError


def _records(output_dir: Path) -> list[dict]:
    path = output_dir / "metrics.jsonl"
    if not path.is_file():
        raise UserError(f"{path}: no metrics (is {output_dir} a run's output_dir?)")
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def read_metrics(output_dir: Path) -> list[dict]:
    """The train records of ``metrics.jsonl`` (eval records left out)."""
    return [r for r in _records(output_dir) if "loss" in r]


def read_evals(output_dir: Path) -> list[dict]:
    """The eval records of ``metrics.jsonl``: each evaluation's metrics with its ``step``."""
    return [{**r["eval"], "step": r["step"]} for r in _records(output_dir) if "eval" in r]


def eval_series(evals: list[dict], key: str) -> tuple[list[int], list[float]]:
    """``(steps, values)`` of one eval metric, over the evaluations that report it."""
    points = [(e["step"], e[key]) for e in evals if isinstance(e.get(key), (int, float))]
    return [s for s, _ in points], [v for _, v in points]


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
    evals = read_evals(output_dir)
    accuracies = sorted({k for e in evals for k in e if k.startswith("accuracy_")})
    has_acc = bool(accuracies) or bool(eval_series(evals, "token_accuracy")[0])
    panels = 4 if has_acc else 3
    fig, axes = plt.subplots(panels, 1, figsize=(7, 2.7 * panels), sharex=True)
    for ax, key, label in zip(
        axes, ("loss", "lr", "tokens_per_s"), ("loss", "learning rate", "tokens/s"), strict=False
    ):
        ax.plot(steps, [r.get(key) for r in rows], label="train" if key == "loss" else None)
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
    if evals:
        axes[0].plot(*eval_series(evals, "eval_loss"), marker="o", label="eval")
        axes[0].legend()
    if has_acc:
        ax = axes[3]
        for key in ("token_accuracy", *accuracies):
            ax.plot(*eval_series(evals, key), marker="o", label=key.removeprefix("accuracy_"))
        ax.set_ylabel("eval accuracy")
        ax.grid(alpha=0.3)
        ax.legend()
    axes[-1].set_xlabel("step")
    fig.suptitle(str(output_dir))
    fig.tight_layout()
    out = out or output_dir / "metrics.png"
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out
