"""LoRA on 2 ranks (ddp, fsdp2; rank-0 broadcast and sharded load) gives the losses of 1 rank.
All 2-rank jobs run in one torchrun launch of the distributed tests' worker."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
from peft_helpers import (
    DISTRIBUTED,
    REPO,
    write_adapter_dir,
    write_text_model_dir,
)

from hyper_core.testing import processes

sys.path.insert(0, str(DISTRIBUTED))
from dist_helpers import (
    assert_close,
    kimi_available,
    losses,
    model_config,
    one_thread,  # noqa: F401
    train_here,
    vl_available,
)

pytestmark = pytest.mark.slow

LORA = {"method": "lora", "r": 4}


def _jobs(root: Path, hf: Path, adapter: Path) -> dict[str, dict[str, Any]]:
    """Each job's raw config; the 1-rank reference runs the same config."""
    sharded = model_config("text", root / "unused", peft={**LORA, "init_from": str(adapter)})
    sharded["model"] = {"adapter": "hf_causal_lm", "path": str(hf)}
    jobs = {
        "text-ddp": model_config("text", root, parallel={"strategy": "ddp"}, peft=LORA),
        # Activation checkpointing must not change the math either; adapter-only checkpoints
        # at steps 5 and 10.
        "text-fsdp2": model_config(
            "text",
            root,
            parallel={"strategy": "fsdp2"},
            training={"activation_checkpointing": True},
            checkpoint={"every_steps": 5, "keep_last": None},
            peft=LORA,
        ),
        "text-fsdp2-bf16": model_config(
            "text",
            root,
            parallel={"strategy": "fsdp2"},
            training={"activation_checkpointing": True, "mixed_precision": "bf16"},
            peft=LORA,
        ),
        # Every rank reads its shards of [model] path; LoRA starts from the adapter dir.
        "text-sharded": {**sharded, "parallel": {"strategy": "fsdp2"}},
        # The frozen base in bf16, the adapters in fp32: FSDP2 gathers mixed dtypes, each
        # rank's sharded load reads bf16 shards.
        "text-sharded-bf16-base": {
            **sharded,
            "parallel": {"strategy": "fsdp2"},
            "peft": {**sharded["peft"], "base_dtype": "bfloat16"},
        },
    }
    if vl_available():
        jobs["vl-fsdp2"] = model_config("vl", root, parallel={"strategy": "fsdp2"}, peft=LORA)
    if kimi_available():
        jobs["kimi-fsdp2"] = model_config("kimi", root, parallel={"strategy": "fsdp2"}, peft=LORA)
    return jobs


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, Path]]:
    """Per job: (its 2-rank output dir, its 1-rank output dir)."""
    root = tmp_path_factory.mktemp("peft-ranks")
    hf = write_text_model_dir(root / "model")
    adapter = write_adapter_dir(hf, root / "adapter", r=LORA["r"])
    jobs = _jobs(root, hf, adapter)
    out: dict[str, tuple[Path, Path]] = {}
    worker_jobs = []
    for name, raw in jobs.items():
        two, one = root / name / "two", root / name / "one"
        out[name] = (two, one)
        parallel = {**raw.get("parallel", {}), "timeout_s": 60}
        worker_jobs.append(
            {"config": {**raw, "run": {**raw["run"], "output_dir": str(two)}, "parallel": parallel}}
        )
        single = {k: v for k, v in raw.items() if k != "parallel"}
        train_here({**single, "run": {**raw["run"], "output_dir": str(one)}})
    jobs_file = root / "jobs.json"
    jobs_file.write_text(json.dumps(worker_jobs))
    proc = processes.torchrun(
        DISTRIBUTED / "dist_worker.py",
        [str(jobs_file)],
        nproc=2,
        importable=(DISTRIBUTED, REPO),
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-6000:]
    return out


@pytest.mark.usefixtures("one_thread")
@pytest.mark.parametrize(
    "job", ["text-ddp", "text-fsdp2", "text-sharded", "vl-fsdp2", "kimi-fsdp2"]
)
def test_two_ranks_match_one_rank(runs: dict[str, tuple[Path, Path]], job: str) -> None:
    if job not in runs:
        pytest.fail(f"{job}: its adapter distribution is not installed")
    two, one = runs[job]
    assert len(losses(one)) == 10
    assert_close(losses(two), losses(one), 1e-5)


def test_bf16_two_ranks_follow_one_rank(runs: dict[str, tuple[Path, Path]]) -> None:
    # bf16 autocast rounds differently with sharded reductions (~2e-3 here): close, not equal.
    two, one = runs["text-fsdp2-bf16"]
    assert_close(losses(two), losses(one), 1e-2)
    assert losses(two)[10] < losses(two)[1] - 0.2


def test_a_bf16_base_on_two_ranks_follows_one_rank(runs: dict[str, tuple[Path, Path]]) -> None:
    # one bf16 base on both sides; sharded reductions round differently: close, not equal
    two, one = runs["text-sharded-bf16-base"]
    assert len(losses(one)) == 10
    assert_close(losses(two), losses(one), 1e-2)
    assert_close(losses(one), losses(runs["text-sharded"][1]), 2e-2)  # the fp32 base's


@pytest.mark.usefixtures("one_thread")
def test_two_rank_lora_checkpoint_resumes_on_one_rank(
    runs: dict[str, tuple[Path, Path]], tmp_path: Path
) -> None:
    two, _ = runs["text-fsdp2"]
    checkpoint = two / "checkpoints" / "step-5"
    raw = model_config(
        "text",
        tmp_path,
        training={"activation_checkpointing": True},
        checkpoint={"resume": str(checkpoint)},
        peft=LORA,
    )
    train_here(raw)
    resumed, full = losses(tmp_path), losses(two)
    assert sorted(resumed) == [6, 7, 8, 9, 10]
    assert_close(resumed, {s: full[s] for s in resumed}, 1e-5)
