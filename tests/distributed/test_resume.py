"""Exact resume: after SIGKILL, from an async checkpoint, and past a torn checkpoint folder."""

from __future__ import annotations

import shutil
import signal
from pathlib import Path

import pytest
from dist_helpers import (
    hyper_train,
    load_toml,
    losses,
    one_thread,  # noqa: F401
    text_config,
    train_here,
    write_toml,
)


def _weights(model: object) -> dict[str, object]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}  # type: ignore[attr-defined]


def _assert_same_weights(a: dict[str, object], b: dict[str, object]) -> None:
    import torch

    assert a.keys() == b.keys()
    different = [k for k in a if not torch.equal(a[k], b[k])]  # type: ignore[arg-type]
    assert not different, f"weights differ: {different[:5]}"


#: The run killed and resumed: plain; LoRA (only its weights and their optimizer state are in
#: the checkpoint); token-budget micro-batches (a varying number of samples per micro-batch).
KILLED_RUNS = {
    "plain": {},
    "lora": {"peft": {"method": "lora", "r": 4, "target": ["q_proj", "v_proj"]}},
    "token-budget": {
        "training": {"micro_batch_size": 8},
        "data": {"max_tokens_per_micro_batch": 128},
    },
}


@pytest.mark.slow
@pytest.mark.usefixtures("one_thread")
@pytest.mark.parametrize("variant", list(KILLED_RUNS))
def test_sigkill_during_step_12_then_auto_resume_is_bit_identical(
    tmp_path: Path, variant: str
) -> None:
    extra = KILLED_RUNS[variant]
    training = {"steps": 20, **extra.get("training", {})}
    sections = {k: v for k, v in extra.items() if k != "training"}
    straight = train_here(text_config(tmp_path / "straight", training=training, **sections))
    out = tmp_path / "killed"
    toml = write_toml(
        text_config(
            out,
            training=training,
            checkpoint={"every_steps": 10, "resume": "auto"},
            **sections,
        ),
        tmp_path / "killed.toml",
    )
    # global_step 11 at on_step_begin: step 12 has begun when the process dies.
    proc = hyper_train(["run", str(toml), "--plugin", "chaos_plugin"], HT_KILL_AT_STEP="11")
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-3000:]
    ckpts = out / "checkpoints"
    assert (ckpts / "step-10" / "COMPLETE").is_file()
    assert max(losses(out)) == 11 and not (ckpts / "step-12").exists()

    resumed = train_here(load_toml(toml))
    got, want = losses(out), losses(tmp_path / "straight")
    assert {s: got[s] for s in range(11, 21)} == {s: want[s] for s in range(11, 21)}
    assert resumed.trainer.state.global_step == 20
    _assert_same_weights(_weights(resumed.trainer.model), _weights(straight.trainer.model))


@pytest.mark.usefixtures("one_thread")
def test_async_checkpoint_resumes_bit_identical(tmp_path: Path) -> None:
    first = train_here(
        text_config(
            tmp_path / "a",
            training={"steps": 6},
            checkpoint={"every_steps": 3, "keep_last": None, "async": True},
        )
    )
    ckpts = tmp_path / "a" / "checkpoints"
    assert (ckpts / "step-3" / "COMPLETE").is_file() and (ckpts / "step-6" / "COMPLETE").is_file()
    assert (ckpts / "latest").read_text() == "step-6"
    assert not list(ckpts.glob(".tmp-*"))
    again = train_here(
        text_config(
            tmp_path / "b", training={"steps": 6}, checkpoint={"resume": str(ckpts / "step-3")}
        )
    )
    a, b = losses(tmp_path / "a"), losses(tmp_path / "b")
    assert sorted(b) == [4, 5, 6]
    assert {s: a[s] for s in b} == b
    _assert_same_weights(_weights(again.trainer.model), _weights(first.trainer.model))


@pytest.mark.usefixtures("one_thread")
def test_auto_resume_skips_a_torn_checkpoint(tmp_path: Path) -> None:
    raw = text_config(
        tmp_path, training={"steps": 6}, checkpoint={"every_steps": 2, "keep_last": None}
    )
    train_here(raw)
    first = losses(tmp_path)
    ckpts = tmp_path / "checkpoints"
    # A torn step-6 (no COMPLETE, though `latest` names it) and an unfinished temp folder.
    (ckpts / "step-6" / "COMPLETE").unlink()
    shutil.copytree(ckpts / "step-6", ckpts / ".tmp-step-8")
    (ckpts / "latest").write_text("step-6")
    raw["checkpoint"]["resume"] = "auto"
    run = train_here(raw)
    assert run.trainer.checkpointer.resume_path() is not None
    again = losses(tmp_path)
    records = (tmp_path / "metrics.jsonl").read_text().splitlines()
    assert len(records) == 6 + 2  # resumed at step 4: steps 5 and 6 again
    assert again == first  # and bit-identical to the first time
    assert (ckpts / "step-6" / "COMPLETE").is_file()  # rewritten, complete now
