"""Eval generations (``[training] eval_generate_samples``) on video samples: the logged prompt
shows ``<video>`` and the answer is generated from the clip."""

from __future__ import annotations

from pathlib import Path

from hyper_core.demo.moving_shapes import QUESTION
from hyper_core.testing import run_tiny_training


def test_eval_generations_of_video_samples_are_logged(tmp_path: Path) -> None:
    clips = {"format": "moving_shapes", "image_size": 28, "num_frames": 4}
    config = {
        "run": {"output_dir": str(tmp_path / "run"), "seed": 0},
        "model": {
            "adapter": "qwen2_5_vl",
            "config": "tiny",
            "options": {"video_min_pixels": 28 * 28, "video_max_pixels": 28 * 28},
        },
        "data": {
            "train": {**clips, "num_samples": 4, "path": str(tmp_path / "train")},
            "eval": {**clips, "num_samples": 2, "split": "eval", "path": str(tmp_path / "eval")},
            "max_seq_len": 128,
        },
        "training": {
            "steps": 1,
            "lr": 1e-3,
            "global_batch_size": 2,
            "micro_batch_size": 2,
            "eval_every_steps": 1,
            "eval_generate_samples": 2,
        },
        "logging": {"progress": "none"},
        "checkpoint": {"resume": "none"},
    }
    run = run_tiny_training(config, plugins=["hyper_qwen_vl.plugin"])
    (evaluation,) = run.eval_metrics
    samples = evaluation["samples"]
    raw = run.trainer.datasets.eval.raw_samples
    assert [s["prompt"] for s in samples] == [f"<video>{QUESTION}"] * 2
    assert [s["reference"] for s in samples] == [r["meta"]["answer"] for r in raw[:2]]
    assert all(isinstance(s["answer"], str) for s in samples)
