"""``hyper-train run``: write the resolved config, train, print a summary."""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import Any

from .trainer import Trainer

log = logging.getLogger("hyper_train")


def run_training(config: Any, host: Any) -> Trainer:
    """Train per ``config`` with the plugins of ``host``; returns the finished trainer."""
    from ..config import dump_config

    trainer = Trainer(config, host)
    out = Path(config.run.output_dir)
    trainer.setup()
    if trainer.dist.is_main:
        out.mkdir(parents=True, exist_ok=True)
        (out / "config.toml").write_text(dump_config(config))
    state = trainer.train()
    if trainer.dist.is_main:
        summary = f"done: {state.global_step} steps"
        if state.skipped:
            summary += "; " + ", ".join(f"{k}={v}" for k, v in sorted(state.skipped.items()))
            summary += " samples skipped"
        print(f"hyper-train: {summary}; outputs in {out}", file=sys.stderr)
        accs = {k: v for k, v in trainer.last_eval.items() if k.startswith("accuracy_")}
        if accs:
            line = ", ".join(f"{k.removeprefix('accuracy_')} {v:.3f}" for k, v in accs.items())
            print(f"hyper-train: held-out answer accuracy: {line}", file=sys.stderr)
    if trainer.dist.world_size > 1:
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()
    return trainer
