"""fp32 master weights with bf16 compute (the default at bf16) and the pure-bf16 warning."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest

from hyper_core.config import load_config_dict
from hyper_core.testing import isolated_host, run_tiny_training, tiny_text_config

pytest.importorskip("hyper_qwen_vl")

LR = 1e-5
WARNING = "pure bf16 weights"


def _vl_config(out: Path, dtype: str, mixed: str, lr: float = LR, steps: int = 40) -> dict:
    """The tiny Qwen2.5-VL on short synthetic shape samples (fast on CPU)."""
    return {
        "run": {"output_dir": str(out), "seed": 0},
        "model": {"adapter": "qwen2_5_vl", "config": "tiny", "dtype": dtype},
        "data": {
            "train": {
                "format": "shapes",
                "num_samples": 64,
                "image_size": 56,
                "split": "train",
                "seed": 0,
            },
            "max_seq_len": 128,
            "batching": "packed",
            "num_workers": 0,
        },
        "training": {
            "steps": steps,
            "global_batch_size": 4,
            "micro_batch_size": 4,
            "lr": lr,
            "warmup_steps": 0,
            "mixed_precision": mixed,
        },
        "logging": {"every_steps": 1, "progress": "none"},
        "checkpoint": {"resume": "none"},
    }


def _train(
    tmp_path: Path, name: str, caplog: pytest.LogCaptureFixture, **kw: Any
) -> tuple[Any, list[str]]:
    """The run and its pure-bf16 warnings."""
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="hyper_train"):
        run = run_tiny_training(_vl_config(tmp_path / name, **kw), plugins=["hyper_qwen_vl.plugin"])
    return run, [r.getMessage() for r in caplog.records if WARNING in r.getMessage()]


def test_fsdp2_defaults_to_bf16_gather_and_fp32_reduction() -> None:
    from hyper_core.parallel.fsdp2 import FSDP2

    host = isolated_host()

    def policy(**sections: dict[str, Any]) -> Any:
        raw = tiny_text_config("unused", training=sections.get("training", {}))
        raw["parallel"] = {"strategy": "fsdp2", **sections.get("parallel", {})}
        cfg = load_config_dict(raw, sections=host.registries.config_sections)
        return FSDP2(cfg.parallel, cfg.training).mixed_precision()

    import torch

    bf16 = policy(training={"mixed_precision": "bf16"})
    assert (bf16.param_dtype, bf16.reduce_dtype) == (torch.bfloat16, torch.float32)
    off = policy()
    assert (off.param_dtype, off.reduce_dtype) == (None, None)
    explicit = policy(
        training={"mixed_precision": "bf16"},
        parallel={"param_dtype": "float32", "reduce_dtype": "bfloat16"},
    )
    assert (explicit.param_dtype, explicit.reduce_dtype) == (torch.float32, torch.bfloat16)


def test_rounded_away_fraction_counts_trainable_bf16_entries() -> None:
    import torch

    from hyper_core.parallel.env import DistEnv
    from hyper_core.step.precision import rounded_away_fraction

    model = torch.nn.Linear(4, 1, bias=True).to(torch.bfloat16)
    with torch.no_grad():
        # |w| · 2^-9 > 1e-3 for |w| > 0.512: two of the four weights
        model.weight.copy_(torch.tensor([[1.0, -0.75, 0.5, 0.01]]))
    model.bias.requires_grad_(False)  # frozen: not counted
    dist = DistEnv(device=torch.device("cpu"))
    assert rounded_away_fraction(model, 1e-3, dist) == 0.5
    assert rounded_away_fraction(model.float(), 1e-3, dist) is None  # no bf16 weights


def test_fp32_master_weights_match_fp32_and_pure_bf16_lags(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    import torch

    fp32, fp32_warnings = _train(tmp_path, "fp32", caplog, dtype="float32", mixed="no")
    master, master_warnings = _train(tmp_path, "master", caplog, dtype="float32", mixed="bf16")
    pure, pure_warnings = _train(tmp_path, "pure", caplog, dtype="bfloat16", mixed="bf16")
    runs = {"fp32": fp32, "master": master, "pure": pure}
    progress = {k: r.losses[0] - r.losses[-1] for k, r in runs.items()}
    for name, run in runs.items():
        print(f"{name}: loss {run.losses[0]:.4f} -> {run.losses[-1]:.4f} ({len(run.losses)} steps)")
    assert len(master.losses) == 40
    # fp32 master weights with bf16 compute: the parameters and AdamW state stay fp32...
    model, optimizer = master.trainer.model, master.trainer.optimizer
    assert {p.dtype for p in model.parameters()} == {torch.float32}
    states = [t for s in optimizer.state.values() for k, t in s.items() if k != "step"]
    assert states and all(t.dtype == torch.float32 for t in states)
    # ...and the run follows full fp32 (within 2% of its loss, and of its progress)
    assert master.losses[-1] == pytest.approx(fp32.losses[-1], rel=0.02)
    assert progress["master"] == pytest.approx(progress["fp32"], rel=0.1)
    # pure bf16 loses most small updates (observed: under half the progress of fp32)
    assert progress["pure"] < 0.7 * progress["fp32"]
    # the opt-in warns once, naming the measured fraction; fp32 weights never warn
    assert fp32_warnings == [] and master_warnings == []
    assert len(pure_warnings) == 1
    assert "at lr 1e-05" in pure_warnings[0] and "% of weights" in pure_warnings[0]


def test_pure_bf16_at_a_large_lr_does_not_warn(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    run, warnings = _train(
        tmp_path, "large", caplog, dtype="bfloat16", mixed="bf16", lr=1e-2, steps=1
    )
    assert run.losses and warnings == []
