"""Hooks: pluggy dispatch cost per training step, as a fraction of the tiny model's step.

A step fires ``on_step_begin``, ``on_micro_step_end`` per micro-batch, ``on_step_end`` and,
when logging, ``on_log``. We time those calls on the run's real plugin manager (every
installed plugin loaded and enabled, plus the built-in callbacks), then the tiny step itself.
"""

from __future__ import annotations

import statistics
import tempfile
import time
from pathlib import Path

from .runner import Ratio, Result

REPO = Path(__file__).resolve().parents[1]


def run(size: str = "full") -> Result:
    """Dispatch time per step vs step time of the tiny demo model."""
    from hyper_core.config import load_config
    from hyper_core.plugins import PluginHost
    from hyper_core.trainer.trainer import Trainer

    host = PluginHost()  # every installed plugin
    steps = 10 if size == "ci" else 40
    with tempfile.TemporaryDirectory() as tmp:
        overrides = [f"--run.output_dir={tmp}", "--logging.progress=none"]
        sections = dict(host.registries.config_sections)
        for name in ("memory_profiler", "encoder_parallel"):
            if name in sections:
                overrides.append(f"--{name}.enabled=true")
        cfg_path = REPO / "configs" / "qwen2_5_vl_demo.toml"
        if "qwen2_5_vl" not in host.registries.model_adapters:
            cfg_path = REPO / "configs" / "text_demo.toml"
        config = load_config(cfg_path, overrides, sections)
        trainer = Trainer(config, host)
        trainer.setup()
        loader = iter(trainer.dataloaders.train)
        batches = [next(loader) for _ in range(4)]
        for b in batches[:2]:
            trainer.train_step(b)  # warm up
        step_times = []
        for i in range(steps):
            t0 = time.perf_counter()
            trainer.train_step(batches[i % len(batches)])
            step_times.append(time.perf_counter() - t0)
        n_micro = len(batches[0].micro_batches)
        state = trainer.state
        hook = host.pm.hook
        mbs = batches[0].micro_batches
        calls = 2000 if size == "ci" else 20000
        import torch

        loss = torch.zeros(())
        t0 = time.perf_counter()
        for _ in range(calls):
            hook.on_step_begin(trainer=trainer, state=state, micro_batches=mbs)
            for m in range(n_micro):
                hook.on_micro_step_end(trainer=trainer, state=state, micro_step=m, loss=loss)
            hook.on_step_end(trainer=trainer, state=state, loss=1.0, loss_dict={}, grad_norm=1.0)
        per_step = (time.perf_counter() - t0) / calls
        t0 = time.perf_counter()
        for _ in range(calls):
            hook.on_log(trainer=trainer, state=state, metrics={"step": 1, "loss": 1.0, "lr": 1.0})
        per_log = (time.perf_counter() - t0) / calls
        trainer._teardown()
    result = Result("hooks", "pluggy dispatch per step vs the tiny model's step time")
    result.params.update(
        model=str(cfg_path.name),
        micro_batches_per_step=n_micro,
        steps=steps,
        plugins=sorted(r.name for r in host.records.values() if r.status != "disabled"),
        log_every_steps=config.logging.every_steps,
    )
    every = config.logging.every_steps
    result.figure("dispatch_per_step", "s").values.append(per_step + per_log / every)
    result.figure("dispatch_per_step_with_log", "s").values.append(per_step + per_log)
    result.figure("tiny_step", "s").values.extend(step_times)
    result.ratios["dispatch_fraction"] = Ratio("dispatch_per_step", "tiny_step", "< 0.005")
    result.notes.append(
        f"median tiny step {statistics.median(step_times) * 1e3:.1f} ms; dispatch "
        f"{per_step * 1e6:.1f} µs per step + {per_log * 1e6:.1f} µs per logged step"
    )
    return result
