"""Dataloader: how long the trainer waits for data per step, as a fraction of step time.

The real trainer loop on the multimodal demo data with the default worker count (the demo
config itself sets 0 workers: on a CPU-only machine the step's threads take every core); the
wait is measured around ``next(loader)`` by the trainer itself (``data_wait_frac`` in
metrics.jsonl).
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from .runner import Ratio, Result

REPO = Path(__file__).resolve().parents[1]


def run(size: str = "full") -> Result:
    """Train ``steps`` steps, logging every 10, and read the wait fraction per interval."""
    import attrs

    from hyper_core.config import load_config
    from hyper_core.config.schema import DataConfig
    from hyper_core.testing import isolated_host, read_metrics
    from hyper_core.trainer.trainer import Trainer

    steps = 20 if size == "ci" else 200
    workers = attrs.fields(DataConfig).num_workers.default
    result = Result("dataloader", "data wait per step / step time, multimodal demo data")
    host = isolated_host(["hyper_qwen_vl.plugin"])
    with tempfile.TemporaryDirectory() as tmp:
        config = load_config(
            REPO / "configs" / "qwen2_5_vl_demo.toml",
            [
                f"--run.output_dir={tmp}",
                f"--training.steps={steps}",
                "--logging.every_steps=10",
                "--logging.progress=none",
                "--checkpoint.resume=none",
                f"--data.num_workers={workers}",
            ],
            host.registries.config_sections,
        )
        trainer = Trainer(config, host)
        trainer.setup()
        trainer.dataloaders.eval = None  # time the train loop only
        trainer.train()
        rows = [m for m in read_metrics(tmp) if "data_wait_frac" in m]
    result.params.update(steps=steps, num_workers=config.data.num_workers)
    # The first interval includes worker start-up and the first batches: reported apart.
    result.figure("first_interval_wait_fraction", "fraction").values.append(
        rows[0]["data_wait_frac"]
    )
    result.figure("wait_fraction", "fraction").values.extend(r["data_wait_frac"] for r in rows[1:])
    result.figure("step_time", "s").values.extend(r["step_time_s"] for r in rows[1:])
    result.figure("goal", "fraction").values.append(0.02)
    result.ratios["wait_fraction_vs_2pct"] = Ratio("wait_fraction", "goal", "< 1")
    return result
