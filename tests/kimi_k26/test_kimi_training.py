"""The real trainer in-process: the tiny model learns the bundled shapes data; MoE router
statistics reach metrics.jsonl; the demo recipe validates."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hyper_core.config import load_config
from hyper_core.testing import isolated_host, run_tiny_training
from hyper_kimi_k26.moe import RouterStatsRun, router_modules

REPO = Path(__file__).resolve().parents[2]
PLUGIN = "hyper_kimi_k26.plugin"


def tiny_kimi_config(output_dir: Path, **sections: dict[str, Any]) -> dict[str, Any]:
    cfg: dict[str, Any] = {
        "run": {"output_dir": str(output_dir), "seed": 0},
        "model": {"adapter": "kimi_k26", "config": "tiny"},
        "data": {
            "train": {"format": "shapes", "num_samples": 48, "image_size": 56, "split": "train"},
            "max_seq_len": 256,
            "batching": "packed",
        },
        "training": {
            "steps": 24,
            "global_batch_size": 8,
            "micro_batch_size": 4,
            "lr": 3e-3,
            "warmup_steps": 0,
            "lr_scheduler": "constant",
        },
        "logging": {"every_steps": 1, "progress": "none"},
        "checkpoint": {"resume": "none"},
    }
    for name, values in sections.items():
        cfg.setdefault(name, {}).update(values)
    return cfg


def test_tiny_model_learns_shapes(tmp_path: Path) -> None:
    run = run_tiny_training(tiny_kimi_config(tmp_path / "run"), plugins=[PLUGIN])
    losses = run.losses
    assert len(losses) == 24
    first, last = sum(losses[:4]) / 4, sum(losses[-4:]) / 4
    assert last < 0.6 * first, losses
    record = run.metrics[-1]
    assert {"moe/load_max", "moe/load_min", "moe/balance", "moe/dead_experts"} <= set(record)
    assert record["moe/load_max"] >= 1.0 >= record["moe/load_min"]
    assert type(run.trainer.adapter).__name__ == "KimiK25Adapter"
    # The run's own RouterStatsRun logged them; it is unregistered and its hooks are removed.
    (stats_run,) = [cb for cb in run.trainer.callbacks if isinstance(cb, RouterStatsRun)]
    assert not run.trainer.host.pm.is_registered(stats_run)
    routers = router_modules(run.trainer.unwrapped_model)
    assert routers and not any(module._forward_hooks for _, module in routers)


def test_freeze_vision_trains(tmp_path: Path) -> None:
    cfg = tiny_kimi_config(tmp_path / "frozen", model={"freeze": ["vision"]}, training={"steps": 3})
    run = run_tiny_training(cfg, plugins=[PLUGIN])
    model = run.trainer.unwrapped_model
    frozen = {n for n, p in model.named_parameters() if not p.requires_grad}
    assert frozen and all(n.startswith("model.vision_tower.") for n in frozen)
    assert all(p.grad is None for n, p in model.named_parameters() if n in frozen)
    assert len(run.losses) == 3


def test_demo_recipe_validates() -> None:
    host = isolated_host([PLUGIN])
    cfg = load_config(
        REPO / "configs" / "kimi_k26_demo.toml", sections=host.registries.config_sections
    )
    assert cfg.model.adapter == "kimi_k26" and cfg.model.config == "tiny"
    assert cfg.data.train.format == "shapes"
