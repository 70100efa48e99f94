"""2 ranks (ddp, fsdp2, HSDP) give the losses of 1 rank on the same global batch; a 2-rank
checkpoint resumes on 1 rank and exports to HF. The 2-rank jobs run in the shared launch."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from dist_helpers import (
    MODELS,
    TwoRankRuns,
    assert_close,
    grad_norms,
    kimi_available,
    losses,
    model_config,
    one_thread,  # noqa: F401
    text_config,
    train_here,
    vl_available,
)

pytestmark = pytest.mark.slow
TWO_RANK_TIMEOUT_S = 300


def mixed_vl_data(root: Path) -> str:
    """JSONL where, per global batch of 8 (no shuffle), rank 0's 4 samples have images and
    rank 1's 4 have none: rank 1's forwards need the vision filler to stay in step."""
    from PIL import Image

    root.mkdir(parents=True, exist_ok=True)
    colours = {"red": (220, 30, 30), "blue": (30, 30, 220), "green": (30, 200, 30)}
    for name, rgb in colours.items():
        Image.new("RGB", (56 + 28 * len(name) % 56, 56), rgb).save(root / f"{name}.png")
    lines = []
    for block in range(8):
        for i in range(4):
            name = list(colours)[(block + i) % 3]
            lines.append(
                {
                    "messages": [
                        {
                            "role": "user",
                            "content": [
                                {"type": "image", "image": f"{name}.png"},
                                {"type": "text", "text": "What colour?"},
                            ],
                        },
                        {"role": "assistant", "content": name},
                    ]
                }
            )
        for i in range(4):
            lines.append(
                {
                    "messages": [
                        {"role": "user", "content": f"Repeat: word{block}{i}"},
                        {"role": "assistant", "content": f"word{block}{i}"},
                    ]
                }
            )
    path = root / "mixed.jsonl"
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    return str(path)


def mixed_vl_config(out: Path, data_root: Path, **sections: Any) -> dict[str, Any]:
    """The tiny VL run on :func:`mixed_vl_data`."""
    return model_config(
        "vl", out, data={"train": mixed_vl_data(data_root), "shuffle": False}, **sections
    )


def _jobs(root: Path) -> dict[str, dict[str, Any]]:
    jobs = {
        # ddp with async checkpoints every 3 steps: background saves overlap training steps.
        "text-ddp": {
            "config": text_config(
                root / "text-ddp",
                parallel={"strategy": "ddp"},
                checkpoint={"every_steps": 3, "keep_last": None, "async": True},
            )
        },
        # fsdp2 with activation checkpointing (must not change the math), checkpoints at 5
        # and 10 (kept) and the HF export gathered from the shards.
        "text-fsdp2": {
            "config": text_config(
                root / "text-fsdp2",
                parallel={"strategy": "fsdp2"},
                training={"activation_checkpointing": True},
                checkpoint={"every_steps": 5, "keep_last": None, "export_hf": True},
            ),
            "probe": True,
        },
        # HSDP: replicate over 2 groups of 1 shard (the replicate all-reduce path).
        "text-hsdp": {
            "config": text_config(
                root / "text-hsdp", parallel={"strategy": "fsdp2", "dp_replicate": 2}
            )
        },
    }
    if kimi_available():
        for strategy in ("ddp", "fsdp2"):
            name = f"kimi-{strategy}"
            jobs[name] = {
                "config": model_config("kimi", root / name, parallel={"strategy": strategy})
            }
    if vl_available():
        for strategy in ("ddp", "fsdp2"):
            name = f"vl-{strategy}"
            # fsdp2 with op-level checkpointing in the decoder, every 2nd vision block whole
            # (the 1-rank reference checkpoints nothing: the math must not change)
            training = {
                "activation_checkpointing": "selective",
                "vision_activation_checkpointing": "every_n",
            }
            cfg = model_config(
                "vl",
                root / name,
                parallel={"strategy": strategy},
                **({"training": training} if strategy == "fsdp2" else {}),
            )
            jobs[name] = {"config": cfg}
            mixed = f"vl-mixed-{strategy}"
            jobs[mixed] = {
                "config": mixed_vl_config(
                    root / mixed, root / "mixed-data", parallel={"strategy": strategy}
                )
            }
    return jobs


def two_rank_jobs(root: Path) -> list[dict[str, Any]]:
    """This module's jobs of the shared 2-rank launch (``conftest.two_rank_runs``)."""
    return list(_jobs(root).values())


@pytest.fixture(scope="module")
def two_ranks(two_rank_runs: TwoRankRuns) -> Path:
    """Every 2-rank job, run once (in the shared launch); the folder of their output_dirs."""
    return two_rank_runs.dir(__name__)


@pytest.fixture(scope="module")
def one_rank(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """1-rank reference runs (this process), per model family."""
    refs = {}
    models = ["text"] + ["vl"] * vl_available() + ["kimi"] * kimi_available()
    for model in models:
        out = tmp_path_factory.mktemp(f"one-rank-{model}")
        train_here(model_config(model, out))
        refs[model] = out
    if vl_available():
        out = tmp_path_factory.mktemp("one-rank-vl-mixed")
        train_here(mixed_vl_config(out, out / "data"))
        refs["vl-mixed"] = out
    return refs


@pytest.mark.parametrize("strategy", ["ddp", "fsdp2"])
@pytest.mark.parametrize("model", MODELS)
def test_two_ranks_match_one_rank(
    two_ranks: Path, one_rank: dict[str, Path], model: str, strategy: str
) -> None:
    out = two_ranks / f"{model}-{strategy}"
    assert_close(losses(out), losses(one_rank[model]), 1e-4)
    # Clipping is active (norms ~3 > max_grad_norm 1): the norm must be global over shards.
    norms = grad_norms(out)
    assert min(norms.values()) > 1.0
    assert_close(norms, grad_norms(one_rank[model]), 1e-4)
    # Rank 0 alone writes metrics: one record per step.
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == list(range(1, 11))


@pytest.mark.parametrize("strategy", ["ddp", "fsdp2"])
def test_a_rank_without_images_stays_in_step(
    two_ranks: Path, one_rank: dict[str, Path], strategy: str
) -> None:
    if "vl-mixed" not in one_rank:
        pytest.fail("the Qwen-VL adapter is not installed")
    out = two_ranks / f"vl-mixed-{strategy}"
    assert_close(losses(out), losses(one_rank["vl-mixed"]), 1e-4)
    assert_close(grad_norms(out), grad_norms(one_rank["vl-mixed"]), 1e-4)


def test_hsdp_matches_one_rank(two_ranks: Path, one_rank: dict[str, Path]) -> None:
    assert_close(losses(two_ranks / "text-hsdp"), losses(one_rank["text"]), 1e-4)


@pytest.mark.usefixtures("one_thread")
def test_two_rank_async_checkpoints_complete_and_resume(two_ranks: Path, tmp_path: Path) -> None:
    ckpts = two_ranks / "text-ddp" / "checkpoints"
    assert [p.name for p in sorted(ckpts.glob("step-*"))] == [
        "step-10", "step-3", "step-6", "step-9",
    ]  # fmt: skip
    assert all((p / "COMPLETE").is_file() for p in ckpts.glob("step-*"))
    assert (ckpts / "latest").read_text() == "step-10" and not list(ckpts.glob(".tmp-*"))
    train_here(text_config(tmp_path, checkpoint={"resume": str(ckpts / "step-6")}))
    resumed, two = losses(tmp_path), losses(two_ranks / "text-ddp")
    assert_close(resumed, {s: two[s] for s in (7, 8, 9, 10)}, 1e-5)


@pytest.mark.usefixtures("one_thread")
def test_two_rank_checkpoint_resumes_on_one_rank(two_ranks: Path, tmp_path: Path) -> None:
    ckpt = two_ranks / "text-fsdp2" / "checkpoints" / "step-5"
    assert (ckpt / "COMPLETE").is_file()
    assert sorted(p.name for p in (ckpt / "extra").iterdir()) == ["rank-0.pt", "rank-1.pt"]
    assert len(list(ckpt.glob("*.distcp"))) == 2  # one shard file per saving rank
    run = train_here(text_config(tmp_path, checkpoint={"resume": str(ckpt)}))
    resumed = losses(tmp_path)
    assert sorted(resumed) == [6, 7, 8, 9, 10]
    two = losses(two_ranks / "text-fsdp2")
    assert abs(resumed[6] - two[6]) <= 1e-5
    assert_close(resumed, {s: two[s] for s in resumed}, 1e-4)
    assert run.trainer.state.global_step == 10


def _hf_logits(path: Path) -> Any:
    from dist_helpers import probe_logits
    from transformers import AutoModelForCausalLM

    return probe_logits(AutoModelForCausalLM.from_pretrained(path, local_files_only=True))


def test_fsdp2_export_hf_loads_with_transformers(two_ranks: Path) -> None:
    import torch

    out = two_ranks / "text-fsdp2"
    hf = out / "hf"
    assert (hf / "config.json").is_file() and list(hf.glob("*.safetensors"))
    assert (hf / "tokenizer.json").is_file() or (hf / "tokenizer_config.json").is_file()
    trained = torch.load(out / "probe_logits.pt")
    torch.testing.assert_close(_hf_logits(hf), trained, atol=1e-5, rtol=0)


def test_export_command_on_a_two_rank_checkpoint(two_ranks: Path, tmp_path: Path) -> None:
    import torch

    from hyper_core.cli import main

    out = two_ranks / "text-fsdp2"
    target = tmp_path / "hf"
    assert main(["export", str(out / "checkpoints" / "step-10"), "--out", str(target)]) == 0
    trained = torch.load(out / "probe_logits.pt")
    torch.testing.assert_close(_hf_logits(target), trained, atol=1e-5, rtol=0)
