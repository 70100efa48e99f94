"""2 fsdp2 ranks whose micro-batches mix text, images and videos differently (one rank's has
images only while the other's has both) stay in step (the vision filler makes every forward
run the tower twice) and train with the 1-rank losses; so does the same run under
``[parallel] cp = 2``, whose ranks share out the encoding of every row's images and videos.
The jobs run in the shared launch."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from dist_helpers import (
    TwoRankRuns,
    assert_close,
    grad_norms,
    losses,
    one_thread,  # noqa: F401
    train_here,
    vl_available,
    vl_config,
)

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not vl_available(), reason="hyper-train-qwen-vl not installed"),
]
TWO_RANK_TIMEOUT_S = 120
#: Per global batch of 8 (no shuffle, 2 per micro-batch): rank 0's micro-batches are
#: (image, image) and (video, text), rank 1's (both, text) and (image, video). Without a filler
#: for each kind, rank 0's forwards run the tower once and rank 1's twice.
BLOCK = ["image", "image", "video", "text", "both", "text", "image", "video"]


def mixed_media_data(root: Path) -> str:
    """JSONL of 3 blocks of :data:`BLOCK`: colour questions on images and 4-frame clips."""
    from PIL import Image

    root.mkdir(parents=True, exist_ok=True)
    colours = {"red": (220, 30, 30), "blue": (30, 30, 220), "green": (30, 200, 30)}
    for name, rgb in colours.items():
        for k in range(4):
            Image.new("RGB", (56 + 28 * (k % 2), 56), rgb).save(root / f"{name}{k}.png")
    lines = []
    for block in range(3):
        for i, kind in enumerate(BLOCK):
            name = list(colours)[(block + i) % 3]
            image = {"type": "image", "image": f"{name}0.png"}
            video = {"type": "video", "video": [f"{name}{k}.png" for k in range(4)]}
            media = {"image": [image], "video": [video], "both": [image, video], "text": []}[kind]
            question = {"type": "text", "text": f"What colour? ({block}{i})"}
            lines.append(
                {
                    "messages": [
                        {"role": "user", "content": [*media, question]},
                        {"role": "assistant", "content": name},
                    ]
                }
            )
    path = root / "mixed-media.jsonl"
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    return str(path)


def _config(out: Path, data: str, attn: str = "sdpa", **parallel: Any) -> dict[str, Any]:
    options = {"video_min_pixels": 28 * 28 * 4, "video_max_pixels": 28 * 28 * 8}
    return vl_config(
        out,
        model={"options": options, "attn_implementation": attn},
        data={"train": data, "shuffle": False},
        training={"steps": 3},
        parallel=parallel,
    )


def two_rank_jobs(root: Path) -> list[dict[str, Any]]:
    """This module's jobs of the shared 2-rank launch (``conftest.two_rank_runs``): the
    mixed run on 2 fsdp2 ranks, and under ``[parallel] cp = 2`` (both ranks read every row
    and share out its images' and videos' encoding)."""
    data = mixed_media_data(root / "data")
    return [
        {"config": _config(root / "fsdp2", data, strategy="fsdp2")},
        {"config": _config(root / "cp", data, "varlen", strategy="fsdp2", cp=2)},
    ]


@pytest.mark.usefixtures("one_thread")
def test_mixed_images_and_videos_on_two_fsdp2_ranks_match_one_rank(
    two_rank_runs: TwoRankRuns, tmp_path: Path
) -> None:
    train_here(_config(tmp_path / "one", mixed_media_data(tmp_path / "data")))
    two = two_rank_runs.dir(__name__) / "fsdp2"
    assert len(losses(two)) == 3
    assert_close(losses(two), losses(tmp_path / "one"), 1e-5)
    assert_close(grad_norms(two), grad_norms(tmp_path / "one"), 1e-5)


@pytest.mark.usefixtures("one_thread")
def test_mixed_images_and_videos_under_context_parallel_match_one_rank(
    two_rank_runs: TwoRankRuns, tmp_path: Path
) -> None:
    train_here(_config(tmp_path / "one", mixed_media_data(tmp_path / "data"), "varlen"))
    two = two_rank_runs.dir(__name__) / "cp"
    assert len(losses(two)) == 3
    assert_close(losses(two), losses(tmp_path / "one"), 1e-5)
    assert_close(grad_norms(two), grad_norms(tmp_path / "one"), 1e-5)
