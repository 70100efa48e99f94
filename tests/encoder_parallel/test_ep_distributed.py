"""2 ranks (gloo, CPU), tiny Qwen2.5-VL: balancing changes where images are encoded, not what
is learned. Per-step losses and every parameter's gradient match within 1e-5:

* skewed data (rank 0 holds 4× the images of rank 1): plugin on == plugin off, ddp and fsdp2;
* rank 1 without any image (and a micro-step without images anywhere): plugin on == one rank
  on the same global batch (without the plugin such data breaks ddp and fsdp2: the rank
  without images skips the encoder's collectives);
* installed but not enabled == excluded by ``HYPER_TRAIN_PLUGINS``: bit-identical;
* images and 4-frame videos on rank 0 (a small image on rank 1): plugin on == one rank.

Every job runs in one torchrun launch; a 3-rank launch covers a rank that computes nothing.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from ep_helpers import (
    HERE,
    STEPS,
    assert_same_training,
    needs_vl,
    read_metrics,
    torchrun,
    train_one_rank,
    vl_config,
    write_dataset,
)

pytestmark = [pytest.mark.slow, needs_vl]

ON = {"encoder_parallel": {"enabled": True}}
#: Small videos (4 frames of 56-112 px, at most 8 merged tokens a frame pair).
VIDEO_MODEL = {
    "adapter": "qwen2_5_vl",
    "config": "tiny",
    "options": {"video_min_pixels": 28 * 28 * 4, "video_max_pixels": 28 * 28 * 8},
}


#: Jobs that also count host syncs per step (:mod:`ep_syncs`).
COUNTED = ("ddp-on-skew", "fsdp2-on-none")
#: Where balancing code runs (the plugin, the adapter's split).
BALANCING = ("hyper_encoder_parallel", "hyper_core.adapters")


def _jobs(root: Path, data: dict[str, Path]) -> dict[str, dict[str, Any]]:
    def job(name: str, kind: str, exclude: tuple[str, ...] = (), **sections: Any) -> Any:
        config = vl_config(root / name, data[kind], **sections)
        return {"config": config, "exclude": exclude, "count_syncs": name in COUNTED}

    return {
        "ddp-off-skew": job("ddp-off-skew", "skew", parallel={"strategy": "ddp"}),
        "ddp-excluded-skew": job(
            "ddp-excluded-skew", "skew", ("encoder_parallel",), parallel={"strategy": "ddp"}
        ),
        "ddp-on-skew": job("ddp-on-skew", "skew", parallel={"strategy": "ddp"}, **ON),
        "ddp-on-none": job("ddp-on-none", "none", parallel={"strategy": "ddp"}, **ON),
        "fsdp2-off-skew": job("fsdp2-off-skew", "skew", parallel={"strategy": "fsdp2"}),
        # With activation checkpointing of the sharding units (it must not change the math).
        "fsdp2-on-skew": job(
            "fsdp2-on-skew",
            "skew",
            parallel={"strategy": "fsdp2"},
            training={"activation_checkpointing": True},
            **ON,
        ),
        # The strategy route: `encoder_parallel` over its default base, fsdp2.
        "fsdp2-on-none": job("fsdp2-on-none", "none", parallel={"strategy": "encoder_parallel"}),
        "fsdp2-on-video": job(
            "fsdp2-on-video", "video", parallel={"strategy": "fsdp2"}, model=VIDEO_MODEL, **ON
        ),
    }


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("encoder_parallel")
    data = {kind: write_dataset(root / "data", kind) for kind in ("skew", "none", "video")}
    (root / "jobs.json").write_text(json.dumps(_jobs(root, data)))
    proc = torchrun(HERE / "ep_worker.py", [str(root / "jobs.json")])
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    train_one_rank(root / "one-rank-none", vl_config(root / "one-rank-none", data["none"]))
    video = vl_config(root / "one-rank-video", data["video"], model=VIDEO_MODEL)
    train_one_rank(root / "one-rank-video", video)
    return root


def stats(out: Path, world: int = 2) -> list[dict[str, int]]:
    return [json.loads((out / f"ep_stats-rank{r}.json").read_text()) for r in range(world)]


@pytest.mark.parametrize("strategy", ["ddp", "fsdp2"])
def test_skewed_data_trains_the_same_with_the_plugin(root: Path, strategy: str) -> None:
    on, off = root / f"{strategy}-on-skew", root / f"{strategy}-off-skew"
    assert_same_training(on, off)
    metrics = read_metrics(on)
    assert len(metrics) == STEPS
    for m in metrics:
        assert m["encoder_parallel/imbalance_before"] > 1.5
        assert m["encoder_parallel/imbalance_after"] <= 1.10
        assert m["encoder_parallel/rebalanced"] == 1.0
        assert 0 < m["encoder_parallel/images_moved"] < 1
    assert not any(k.startswith("encoder_parallel/") for m in read_metrics(off) for k in m)
    # Rank 0 owns 4× the images of rank 1; the ranks end up encoding about as many patches.
    r0, r1 = stats(on)
    assert r0["images_owned"] == 4 * r1["images_owned"]
    assert r1["images_computed"] > r1["images_owned"]
    assert r0["encoder_calls"] == r1["encoder_calls"] == 2 * STEPS


@pytest.mark.parametrize("strategy", ["ddp", "fsdp2"])
def test_rank_without_images_trains_like_one_rank(root: Path, strategy: str) -> None:
    on = root / f"{strategy}-on-none"
    assert_same_training(on, root / "one-rank-none")
    r0, r1 = stats(on)
    assert r1["images_owned"] == 0 and r1["images_computed"] > 0
    # Equal encoder calls on both ranks (FSDP2's block all-gathers stay matched): one per
    # micro-step with images anywhere, none for the micro-step without images; the micro-step
    # with a single image is not rebalanced and rank 1 runs a dummy.
    assert r0["micro_steps"] == r1["micro_steps"] == 2 * STEPS
    assert r0["micro_steps_with_images"] == 2 * STEPS - 1
    assert r0["encoder_calls"] == r1["encoder_calls"] == 2 * STEPS - 1
    assert (r0["dummy_calls"], r1["dummy_calls"]) == (0, 1)


@pytest.mark.parametrize("job", COUNTED)
def test_host_syncs_per_step_do_not_grow_with_the_images(root: Path, job: str) -> None:
    """Encoder parallelism never waits for the device: the images' sizes and metadata are read
    from the micro-batch's host tensors, and the header, records and token counts go between
    ranks as host objects over gloo. A step syncs at most 3 times on 2 ranks, all of them the
    core's, whatever the images (skew: 8 on rank 0, 2 on rank 1): the global count of loss
    tokens, lockstep's micro-batch count, and the loss and gradient norm together."""
    images_per_step = set()
    for rank in range(2):
        steps = json.loads((root / job / f"syncs-rank{rank}.json").read_text())
        assert len(steps) == STEPS
        for step in steps:
            assert step["syncs"] <= 3, step
            assert not [c for c in step["callers"] if c.startswith(BALANCING)], step
            images_per_step.add(step["images"])
    assert len(images_per_step) > 1, images_per_step


def test_installed_but_not_enabled_is_bit_identical(root: Path) -> None:
    off, excluded = root / "ddp-off-skew", root / "ddp-excluded-skew"
    assert_same_training(off, excluded, tol=0.0)
    assert stats(off) == stats(excluded) == [None, None]
    assert "[encoder_parallel]" in (off / "config.toml").read_text()
    assert "[encoder_parallel]" not in (excluded / "config.toml").read_text()


@pytest.fixture(scope="module")
def three_ranks(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("encoder_parallel_3")
    data = write_dataset(root / "data", "three")
    sections: dict[str, Any] = {
        "training": {"global_batch_size": 6},
        "encoder_parallel": {"cost_model": "patches+attention", "attention_patches": 64},
    }
    job = vl_config(root / "fsdp2-3", data, parallel={"strategy": "encoder_parallel"}, **sections)
    (root / "jobs.json").write_text(json.dumps({"fsdp2-3": {"config": job}}))
    proc = torchrun(HERE / "ep_worker.py", [str(root / "jobs.json")], nproc=3)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    reference = vl_config(root / "one-rank", data, training={"global_batch_size": 6})
    train_one_rank(root / "one-rank", reference)
    return root


def test_three_ranks_with_one_computing_nothing(three_ranks: Path) -> None:
    """Two images on rank 0 over three ranks: one goes to another rank, the third rank
    encodes a dummy in the exchange; four images: every rank encodes one or more."""
    out = three_ranks / "fsdp2-3"
    assert_same_training(out, three_ranks / "one-rank")
    counts = stats(out, world=3)
    assert [c["encoder_calls"] for c in counts] == [STEPS] * 3
    assert sum(c["images_computed"] for c in counts) == counts[0]["images_owned"] == 14
    assert sum(c["dummy_calls"] for c in counts) == 3  # the even steps 0, 2, 4
    for m in read_metrics(out):
        assert m["encoder_parallel/imbalance_before"] == pytest.approx(3.0)
        assert m["encoder_parallel/imbalance_after"] < 2.0


def test_videos_are_balanced_like_images(root: Path) -> None:
    # a video is one entry of the encoder's work (its frames' patches); the adapter injects
    # the outputs of images and videos apart (mm_encoder_outputs "image" and "video")
    on = root / "fsdp2-on-video"
    assert_same_training(on, root / "one-rank-video")
    r0, r1 = stats(on)
    assert (r0["images_owned"], r1["images_owned"]) == (6 * STEPS, STEPS)  # videos count
    assert r1["images_computed"] > r1["images_owned"]
    assert r0["encoder_calls"] == r1["encoder_calls"] == 2 * STEPS
    assert all(m["encoder_parallel/rebalanced"] > 0 for m in read_metrics(on))
