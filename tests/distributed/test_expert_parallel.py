"""Expert parallelism (``[parallel] ep``) gives the losses and gradient norms of one rank.

Tiny Qwen3-VL-MoE and tiny Kimi-K2.5, both with 8 routed experts, train 5 steps on 1 rank
(this process) and on 2 ranks (``ep = 2``) and 4 ranks (``dp_shard = 4, ep = 2`` and
``ep = 4``); each rank must hold only its experts. The 2-rank launch also covers routing so
skewed that a rank receives no token, a checkpoint saved with ``ep = 2`` resumed with
``ep = 1`` (2 ranks, and 1 rank), loading ``[model] path`` shard-wise, and the HF export;
both launches also run Qwen3-VL-MoE (and the 2-rank one Kimi-K2.5) under ``[parallel] cp = 2``
with expert parallelism.
Two torchrun launches (2 and 4 ranks) run every multi-rank job.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
from dist_helpers import HERE, assert_close, grad_norms, losses, train_here, vl_config
from moe_routing import SkewedRouting

from hyper_core.testing.processes import torchrun

pytestmark = pytest.mark.slow

EXPERTS = 8
MODELS = {
    "qwen": {
        "adapter": "qwen3_vl_moe",
        "config": "tiny",
        "hf_overrides": {"text_config.num_experts": EXPERTS},
    },
    "kimi": {
        "adapter": "kimi_k25",
        "config": "tiny",
        "hf_overrides": {"text_config.n_routed_experts": EXPERTS},
    },
}
LAYOUTS = {  # name -> (ranks, [parallel] keys)
    "ep2": (2, {"ep": 2}),
    "s4-ep2": (4, {"ep": 2}),
    "ep4": (4, {"ep": 4}),
}


def moe_config(model: str, out: Path, **sections: Any) -> dict[str, Any]:
    """5 steps of the tiny VL run with ``model``'s 8-expert tiny MoE."""
    training = {"steps": 5, **sections.pop("training", {})}
    cfg = vl_config(out, training=training, **sections)
    cfg["model"] = dict(MODELS[model])
    return cfg


def ep_config(model: str, out: Path, ep: int, **sections: Any) -> dict[str, Any]:
    """:func:`moe_config` under fsdp2 with ``ep``."""
    parallel = {"strategy": "fsdp2", "timeout_s": 60, "ep": ep}
    return moe_config(model, out, parallel=parallel, **sections)


def path_config(model: str, root: Path, out: Path) -> dict[str, Any]:
    """2 steps from ``[model] path`` = the HF export of ``model``'s 1-rank run."""
    cfg = moe_config(model, out, training={"steps": 2})
    cfg["model"] = {"adapter": MODELS[model]["adapter"], "path": str(root / f"{model}-one" / "hf")}
    return cfg


def cp_config(model: str, out: Path, **parallel: int) -> dict[str, Any]:
    """:func:`moe_config` with ``varlen`` attention (what ``[parallel] cp`` runs), under fsdp2
    with ``parallel`` when given."""
    cfg = moe_config(model, out)
    cfg["model"]["attn_implementation"] = "varlen"
    if parallel:
        cfg["parallel"] = {"strategy": "fsdp2", "timeout_s": 60, **parallel}
    return cfg


def launch(jobs: list[dict[str, Any]], nproc: int, root: Path) -> None:
    jobs_file = root / f"jobs-{nproc}.json"
    jobs_file.write_text(json.dumps(jobs))
    proc = torchrun(HERE / "moe_worker.py", [str(jobs_file)], nproc=nproc, timeout=900)
    assert proc.returncode == 0, proc.stderr[-6000:]


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Every run, 1-rank references first (their HF export is the ``[model] path`` of the
    sharded-load runs); returns the folder of their output_dirs."""
    import torch

    root = tmp_path_factory.mktemp("moe")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # like each rank
    try:
        train_here(moe_config("qwen", root / "qwen-one", checkpoint={"export_hf": True}))
        train_here(moe_config("kimi", root / "kimi-one", checkpoint={"export_hf": True}))
        train_here(moe_config("qwen", root / "qwen-skew-one"), plugins=[SkewedRouting()])
        for m in MODELS:  # 2 steps from the export of the 5 above, the sharded load's reference
            train_here(path_config(m, root, root / f"{m}-path-one"))
        for m in MODELS:  # the references of the cp runs
            train_here(cp_config(m, root / f"{m}-varlen-one"))
    finally:
        torch.set_num_threads(threads)
    two = [
        {"config": ep_config("kimi", root / "kimi-ep2", ep=2)},
        {
            "config": ep_config(
                "qwen",
                root / "qwen-ep2",
                ep=2,
                checkpoint={"every_steps": 3, "keep_last": None, "export_hf": True},
            )
        },
        {"config": ep_config("qwen", root / "qwen-skew-ep2", ep=2), "skew": True},
        {
            "config": ep_config(
                "qwen",
                root / "qwen-resume-ep1",
                ep=1,
                checkpoint={"resume": str(root / "qwen-ep2" / "checkpoints" / "step-3")},
            )
        },
    ]
    for m in MODELS:
        path_job = path_config(m, root, root / f"{m}-path-ep2")
        path_job["parallel"] = {"strategy": "fsdp2", "timeout_s": 60, "ep": 2}
        two.append({"config": path_job})
    two += [{"config": cp_config(m, root / f"{m}-cp2-ep2", cp=2, ep=2)} for m in MODELS]
    launch(two, 2, root)
    four = [
        {"config": ep_config(m, root / f"{m}-{layout}", LAYOUTS[layout][1]["ep"])}
        for m in MODELS
        for layout in LAYOUTS
        if LAYOUTS[layout][0] == 4
    ]
    four.append({"config": cp_config("qwen", root / "qwen-s2-cp2-ep4", cp=2, ep=4)})
    launch(four, 4, root)
    return root


@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("model", list(MODELS))
def test_expert_parallel_matches_one_rank(runs: Path, model: str, layout: str) -> None:
    out, one = runs / f"{model}-{layout}", runs / f"{model}-one"
    assert_close(losses(out), losses(one), 1e-5)
    assert_close(grad_norms(out), grad_norms(one), 1e-5)
    ranks, parallel = LAYOUTS[layout]
    # Each rank holds E / ep experts, split again over the ranks holding the same ones.
    shapes = json.loads((out / "shapes.json").read_text())
    assert len(shapes) == ranks and shapes[0]
    for name, (_, full) in shapes[0].items():
        assert full[0] == EXPERTS
        local = [rank[name][0] for rank in shapes]
        assert all(s[0] == EXPERTS // parallel["ep"] for s in local), (name, local)
        held = sum(math.prod(s) for s in local)
        assert held == math.prod(full), (name, local, full)  # every element on one rank
    # Routing statistics in metrics.jsonl; the most expert bytes any rank holds (fp32).
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert all(r["moe/ep_load_max"] >= 1.0 and r["moe/a2a_rows_per_step"] > 0 for r in records)
    assert all(r["moe/expert_load_min"] <= 1.0 <= r["moe/expert_load_max"] for r in records)
    most = max(sum(math.prod(local) for local, _ in rank.values()) for rank in shapes)
    assert records[0]["moe/expert_param_bytes"] == 4 * most


def test_skewed_routing_matches_and_does_not_hang(runs: Path) -> None:
    assert_close(losses(runs / "qwen-skew-ep2"), losses(runs / "qwen-skew-one"), 1e-5)
    assert_close(grad_norms(runs / "qwen-skew-ep2"), grad_norms(runs / "qwen-skew-one"), 1e-5)
    # every assignment went to experts 0 and 1, both on group rank 0 of 8 experts over 2
    records = [json.loads(line) for line in (runs / "qwen-skew-ep2" / "metrics.jsonl").open()]
    assert all(r["moe/expert_load_max"] == 4.0 and r["moe/ep_load_max"] == 2.0 for r in records)
    assert all(r["moe/expert_load_min"] == 0.0 for r in records)
    # the skew really changed the routing
    assert abs(losses(runs / "qwen-skew-one")[5] - losses(runs / "qwen-one")[5]) > 1e-3


def test_checkpoint_of_ep2_resumes_with_ep1_on_two_ranks_and_on_one(
    runs: Path, tmp_path: Path
) -> None:
    ep2 = losses(runs / "qwen-ep2")
    resumed = losses(runs / "qwen-resume-ep1")
    assert_close({s: resumed[s] for s in (4, 5)}, {s: ep2[s] for s in (4, 5)}, 1e-5)
    ckpt = runs / "qwen-ep2" / "checkpoints" / "step-3"
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        train_here(moe_config("qwen", tmp_path, checkpoint={"resume": str(ckpt)}))
    finally:
        torch.set_num_threads(threads)
    one = losses(tmp_path)
    assert sorted(one) == [4, 5]
    assert_close(one, {s: ep2[s] for s in (4, 5)}, 1e-5)


@pytest.mark.parametrize("model", list(MODELS))
def test_sharded_load_of_model_path_under_ep(runs: Path, model: str) -> None:
    # Qwen3-VL-MoE's stacked experts are transposed on load; Kimi's are per-expert keys
    assert_close(losses(runs / f"{model}-path-ep2"), losses(runs / f"{model}-path-one"), 1e-5)


def test_export_of_an_ep_run_gives_its_logits(runs: Path) -> None:
    import torch
    from moe_worker import PROBE_IDS
    from transformers import Qwen3VLMoeForConditionalGeneration

    out = runs / "qwen-ep2"
    model = Qwen3VLMoeForConditionalGeneration.from_pretrained(out / "hf", dtype=torch.float32)
    model.eval()
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([PROBE_IDS]), use_cache=False).logits
    trained = torch.load(out / "probe_logits.pt", weights_only=True)
    assert torch.allclose(logits, trained, atol=1e-5), (logits - trained).abs().max()


@pytest.mark.parametrize("run", ["qwen-cp2-ep2", "kimi-cp2-ep2", "qwen-s2-cp2-ep4"])
def test_context_parallel_composes_with_expert_parallel(runs: Path, run: str) -> None:
    # cp = 2 splits each row (its images, Qwen3-VL's deepstack tokens; Kimi's MLA attention)
    # over 2 ranks, whose tokens go to the experts of an ep group: 2 ranks (ep = 2), and 4
    # ranks (dp_shard = 2, cp = 2, ep = 4, an ep group spanning both cp groups)
    one = runs / f"{run.split('-')[0]}-varlen-one"
    assert_close(losses(runs / run), losses(one), 1e-5)
    assert_close(grad_norms(runs / run), grad_norms(one), 1e-5)
    # every rank's decoder ran on half of each row, padded to a multiple of 2·cp, and the two
    # ranks of a cp group shared out the encoding of its images
    ranks = json.loads((runs / run / "tokens.json").read_text())
    for rank in ranks:
        assert rank["model"] <= 2 * rank["decoder"] <= rank["model"] + 3 * rank["rows"], rank
    for first, second in zip(ranks[::2], ranks[1::2], strict=True):
        assert first["patches"] == second["patches"] > 0
        assert first["encoded"] + second["encoded"] == first["patches"], (first, second)
        assert 0 < first["encoded"] < first["patches"], first
    shapes = json.loads((runs / run / "shapes.json").read_text())
    ep = 2 if run.endswith("ep2") else 4
    assert all(local[0] == EXPERTS // ep for rank in shapes for local, _ in rank.values())
