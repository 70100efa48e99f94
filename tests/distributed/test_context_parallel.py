"""Context parallelism (``[parallel] cp = 2``, fsdp2) on 2 ranks gives the per-step losses and
gradient norms of one rank, on the tiny text model and on the tiny Qwen2.5-VL, whose packed
rows are long enough that the split falls inside samples and inside images (checked on the
rows the ranks trained on), and whose rows have odd lengths (padded to a multiple of 4); a
run resumed under ``cp`` from a checkpoint of its step 2 repeats steps 3-5 exactly."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from dist_helpers import (
    TwoRankRuns,
    assert_close,
    grad_norms,
    losses,
    model_config,
    train_here,
    vl_available,
)

pytestmark = pytest.mark.slow
TWO_RANK_TIMEOUT_S = 240
STEPS = 5
CP = 2

MODELS = [
    "text",
    pytest.param("vl", marks=pytest.mark.skipif(not vl_available(), reason="no qwen-vl")),
]


def _models() -> list[str]:
    return ["text"] + (["vl"] if vl_available() else [])


def _config(family: str, out: Path, **parallel: Any) -> dict[str, Any]:
    """``family``'s tiny run, 5 steps, ``varlen`` attention (what ``cp`` runs)."""
    cfg = model_config(family, out, training={"steps": STEPS}, parallel=parallel)
    cfg["model"]["attn_implementation"] = "varlen"
    return cfg


def two_rank_jobs(root: Path) -> list[dict[str, Any]]:
    """This module's jobs of the shared 2-rank launch (``conftest.two_rank_runs``): each model
    under ``cp = 2`` (the text run saving every 2 steps), then the text run resumed from its
    step-2 checkpoint."""
    jobs = []
    for model in _models():
        cfg = _config(model, root / f"{model}-cp", strategy="fsdp2", cp=CP)
        if model == "text":
            cfg["checkpoint"]["every_steps"] = 2
        jobs.append({"config": cfg, "inspect": f"{__name__}:record_splits"})
    resumed = _config("text", root / "text-cp-resumed", strategy="fsdp2", cp=CP)
    resumed["checkpoint"]["resume"] = str(root / "text-cp" / "checkpoints" / "step-2")
    return [*jobs, {"config": resumed}]


def record_splits(trainer: Any) -> Callable[[], dict[str, int]]:
    """Count, over the micro-batches this rank trains on, rows of odd length, the chunk
    boundaries of the split that fall inside a sample and inside an image's tokens, the
    images' patches and those this rank's vision tower encoded."""
    from hyper_core.parallel.context_parallel import RowSplit

    image_token = getattr(trainer.unwrapped_model.config, "image_token_id", None)
    seen = {"micro_batches": 0, "odd_rows": 0, "cuts_in_samples": 0, "cuts_in_images": 0}
    seen["patches"] = 0
    device_batch = trainer.device_batch

    def recording(mb: Any) -> Any:
        ids = mb.model_inputs["input_ids"]
        length = ids.shape[1]
        chunk = RowSplit(CP, 0).padded_length(length) // (2 * CP)
        starts = {int(b) % length for b in mb.model_inputs["cu_seq_lens_q"].tolist()}
        seen["micro_batches"] += 1
        pixels = mb.model_inputs.get("pixel_values")
        seen["patches"] += 0 if pixels is None else pixels.shape[0]
        seen["odd_rows"] += ids.shape[0] * (length % 2)
        for cut in range(chunk, length, chunk):
            if cut not in starts:
                seen["cuts_in_samples"] += ids.shape[0]
            if image_token is not None:
                inside = (ids[:, cut - 1] == image_token) & (ids[:, cut] == image_token)
                seen["cuts_in_images"] += int(inside.sum())
        return device_batch(mb)

    trainer.device_batch = recording

    def result() -> dict[str, int]:
        from hyper_core.parallel.cp_vision import SplitTower

        towers = [m.forward for m in trainer.unwrapped_model.modules()]
        split = [t for t in towers if isinstance(t, SplitTower)]
        seen["patches_encoded"] = split[0].patches_encoded if split else -1
        return seen

    return result


@pytest.fixture(scope="module")
def runs(two_rank_runs: TwoRankRuns) -> Path:
    """The 2-rank runs, and next to them the 1-process references."""
    root = two_rank_runs.dir(__name__)
    for model in _models():
        train_here(_config(model, root / f"{model}-one"))
    return root


@pytest.mark.parametrize("model", MODELS)
def test_cp_on_two_ranks_matches_one_process(runs: Path, model: str) -> None:
    one, two = runs / f"{model}-one", runs / f"{model}-cp"
    assert_close(losses(two), losses(one), 1e-5)
    norms, reference = grad_norms(two), grad_norms(one)
    assert sorted(norms) == sorted(reference)
    for step, norm in norms.items():  # norms are ~3-5: 1e-5 relative is ~20 float32 ulps
        assert norm == pytest.approx(reference[step], rel=1e-5), (step, norms, reference)


@pytest.mark.parametrize("model", MODELS)
def test_cp_rows_were_cut_inside_samples_and_images(runs: Path, model: str) -> None:
    import json

    seen = json.loads((runs / f"{model}-cp" / "inspect.json").read_text())
    assert seen["micro_batches"] >= STEPS
    assert seen["cuts_in_samples"] > 0
    if model == "vl":
        assert seen["cuts_in_images"] > 0
        # rank 0 encoded its share of the images only (hyper_core.parallel.cp_vision)
        assert 0 < seen["patches_encoded"] < seen["patches"], seen
    else:
        assert seen["odd_rows"] > 0


def _tokens_per_step(out: Path) -> dict[int, float]:
    """``step -> tokens`` (``tokens_per_s × step_time_s``: no timing in it, logging every step)."""
    import json

    found = {}
    for line in (out / "metrics.jsonl").read_text().splitlines():
        record = json.loads(line)
        if "tokens_per_s" in record:
            found[int(record["step"])] = record["tokens_per_s"] * record["step_time_s"]
    return found


@pytest.mark.parametrize("model", MODELS)
def test_cp_counts_each_rows_tokens_once(runs: Path, model: str) -> None:
    two, one = _tokens_per_step(runs / f"{model}-cp"), _tokens_per_step(runs / f"{model}-one")
    assert sorted(two) == sorted(one) and len(one) == STEPS
    for step, tokens in one.items():
        assert two[step] == pytest.approx(tokens, rel=1e-9)


def test_cp_resumes_exactly(runs: Path) -> None:
    full, resumed = losses(runs / "text-cp"), losses(runs / "text-cp-resumed")
    assert sorted(resumed) == [3, 4, 5]
    assert resumed == {step: full[step] for step in resumed}


def test_sigkill_under_cp_then_relaunch_repeats_the_uninterrupted_steps(
    runs: Path, tmp_path: Path
) -> None:
    """The shared launch's text run under ``cp = 2``, launched on its own: both ranks die in
    step 4; the relaunch resumes from the step-2 checkpoint and repeats steps 3-5 of the
    uninterrupted run exactly."""
    from dist_helpers import hyper_train, write_toml

    out = tmp_path / "killed"
    raw = _config("text", out, strategy="fsdp2", cp=CP)
    raw["checkpoint"].update(every_steps=2, resume="auto")
    toml = write_toml(raw, tmp_path / "killed.toml")
    two = ["--nproc-per-node", "2"]
    killed = hyper_train(["run", str(toml), *two, "--plugin", "chaos_plugin"], HT_KILL_AT_STEP="3")
    assert killed.returncode != 0
    assert (out / "checkpoints" / "step-2" / "COMPLETE").is_file(), killed.stderr[-3000:]
    assert max(losses(out)) == 3 and not (out / "checkpoints" / "step-4").exists()
    resumed = hyper_train(["run", str(toml), *two])
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    got, want = losses(out), losses(runs / "text-cp")
    assert {s: got[s] for s in range(3, STEPS + 1)} == {s: want[s] for s in range(3, STEPS + 1)}
