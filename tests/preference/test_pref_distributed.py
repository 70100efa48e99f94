"""DPO on 2 fsdp2 ranks equals 1 rank: LoRA with the adapters-off reference, full fine-tuning
with a frozen copy sharded like the policy, and with precomputed reference log-probs (each rank
computes its share)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
from pref_helpers import dpo_config, write_text_pairs

from hyper_core.testing import processes

REPO = Path(__file__).resolve().parents[2]
DISTRIBUTED = REPO / "tests" / "distributed"
sys.path.insert(0, str(DISTRIBUTED))
from dist_helpers import assert_close, losses, one_thread, train_here  # noqa: E402, F401

pytestmark = pytest.mark.slow


def _jobs(root: Path) -> dict[str, dict[str, Any]]:
    pairs = write_text_pairs(root / "pairs.jsonl", 32)
    evaluation = {"eval": {"format": "preference", "path": str(pairs)}, "eval_samples": 8}
    training = {"steps": 4, "lr": 1e-2, "lr_scheduler": "constant"}
    return {
        "lora-adapters-off": dpo_config(
            root,
            pairs,
            preference={"reference": "adapters_off"},
            peft={"method": "lora", "r": 4},
            training=training,
            data=evaluation,
        ),
        "full-copy": dpo_config(
            root,
            pairs,
            preference={"reference": "copy"},
            training={**training, "lr": 1e-3},
            data=evaluation,
        ),
        "full-precompute": dpo_config(
            root,
            pairs,
            preference={"reference": "precompute"},
            training={**training, "lr": 1e-3},
            data=evaluation,
        ),
    }


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, Path]]:
    """Per job: (its 2-rank output dir, its 1-rank output dir)."""
    root = tmp_path_factory.mktemp("preference-ranks")
    out: dict[str, tuple[Path, Path]] = {}
    worker_jobs = []
    for name, raw in _jobs(root).items():
        two, one = root / name / "two", root / name / "one"
        out[name] = (two, one)
        parallel = {"strategy": "fsdp2", "timeout_s": 60}
        worker_jobs.append(
            {"config": {**raw, "run": {**raw["run"], "output_dir": str(two)}, "parallel": parallel}}
        )
        train_here({**raw, "run": {**raw["run"], "output_dir": str(one)}})
    jobs_file = root / "jobs.json"
    jobs_file.write_text(json.dumps(worker_jobs))
    proc = processes.torchrun(
        DISTRIBUTED / "dist_worker.py",
        [str(jobs_file)],
        nproc=2,
        importable=(DISTRIBUTED, REPO, REPO / "tests" / "preference"),
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-6000:]
    return out


def _evaluation(out: Path) -> dict[str, Any]:
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return [r["eval"] for r in records if "eval" in r][-1]


@pytest.mark.usefixtures("one_thread")
@pytest.mark.parametrize("job", ["lora-adapters-off", "full-copy", "full-precompute"])
def test_two_fsdp2_ranks_match_one_rank(runs: dict[str, tuple[Path, Path]], job: str) -> None:
    two, one = runs[job]
    assert len(losses(one)) == 4
    assert_close(losses(two), losses(one), 1e-5)
    mine, single = _evaluation(two), _evaluation(one)
    assert mine["eval_pairs"] == single["eval_pairs"] == 8
    for key in ("eval_loss", "rewards/chosen", "rewards/rejected", "rewards/accuracy"):
        assert mine[key] == pytest.approx(single[key], abs=1e-5), key


@pytest.mark.usefixtures("one_thread")
@pytest.mark.parametrize("reference", ["copy", "precompute"])
def test_sigkill_then_resume_is_bit_identical(tmp_path: Path, reference: str) -> None:
    """Killed while step 6 runs, resumed from step 4: steps 5-8 as in one straight run (the
    copy rebuilt from the starting weights, the precomputed log-probs read back)."""
    import signal

    from dist_helpers import write_toml

    pairs = write_text_pairs(tmp_path / "pairs.jsonl", 32)
    training = {"steps": 8, "lr": 1e-3, "global_batch_size": 4, "micro_batch_size": 2}
    preference = {"reference": reference}
    straight = tmp_path / "straight"
    train_here(dpo_config(straight, pairs, training=training, preference=preference))
    out = tmp_path / "killed"
    checkpoint = {"every_steps": 4, "resume": "auto"}
    raw = dpo_config(out, pairs, training=training, preference=preference, checkpoint=checkpoint)
    toml = write_toml(raw, tmp_path / "killed.toml")
    proc = processes.hyper_train(
        ["run", str(toml), "--plugin", "chaos_plugin"],
        importable=(DISTRIBUTED, REPO),
        timeout=300,
        HT_KILL_AT_STEP="5",
    )
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-3000:]
    assert max(losses(out)) == 5
    train_here(raw)
    got, want = losses(out), losses(straight)
    assert {s: got[s] for s in range(5, 9)} == {s: want[s] for s in range(5, 9)}
    assert abs(want[8] - 0.6931) > 1e-3
