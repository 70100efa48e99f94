"""``ddp`` from ``[model] path``: every rank reads the checkpoint itself (no rank-0 load and
broadcast) and trains exactly as the rank-0 path does from the same weights."""

from __future__ import annotations

import importlib.util
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from dist_helpers import TwoRankRuns, assert_close, losses, text_config, train_here

from tests.peft.peft_helpers import write_adapter_dir

pytestmark = pytest.mark.slow
TWO_RANK_TIMEOUT_S = 150
STEPS = 5


def _write_model_dir(out: Path) -> Path:
    """The weights a seed-0 run of ``text_config`` starts from, as an HF directory."""
    import torch

    from hyper_core.config import load_config_dict
    from hyper_core.plugins import get_plugin_host
    from hyper_core.resolve import resolve_adapter

    config = load_config_dict(text_config(out / "unused"))
    adapter = resolve_adapter(config.model, get_plugin_host().registries)
    torch.manual_seed(0)
    target = out / "hf"
    adapter.build_model(config.model).save_pretrained(str(target))
    return target


def _has_peft() -> bool:
    return importlib.util.find_spec("hyper_peft") is not None


def _lora_config(root: Path, out: Path) -> dict[str, Any]:
    raw = text_config(out, training={"steps": STEPS})
    raw["model"] = {"adapter": "hf_causal_lm", "path": str(root / "hf")}
    raw["peft"] = {"method": "lora", "r": 4, "init_from": str(root / "adapter")}
    return raw


def two_rank_jobs(root: Path) -> list[dict[str, Any]]:
    """ddp from the named config (rank 0 builds, DDP broadcasts) and from the same weights
    written as an HF directory (every rank reads it); with LoRA (whose parameters get their
    values after the load, so DDP is set up at the first forward) when peft is installed."""
    hf = _write_model_dir(root)
    rank0 = text_config(root / "rank0", training={"steps": STEPS}, parallel={"strategy": "ddp"})
    from_path = text_config(root / "path", training={"steps": STEPS}, parallel={"strategy": "ddp"})
    from_path["model"] = {"adapter": "hf_causal_lm", "path": str(hf)}
    inspect = f"{__name__}:loaded_by_each_rank"
    jobs = [{"config": rank0, "inspect": inspect}, {"config": from_path, "inspect": inspect}]
    if _has_peft():
        write_adapter_dir(hf, root / "adapter", r=4)
        lora = _lora_config(root, root / "lora")
        jobs.append({"config": {**lora, "parallel": {"strategy": "ddp"}}})
    return jobs


def loaded_by_each_rank(trainer: Any) -> Callable[[], dict[str, Any]]:
    """Per rank, after setup: whether every parameter came from this rank's own read of the
    checkpoint (transformers marks what it loads), and whether DDP is set up."""
    import torch.distributed as tdist

    params = list(trainer.unwrapped_model.parameters())
    mine = {
        "read_here": all(getattr(p, "_is_hf_initialized", False) for p in params),
        "ddp_ready": hasattr(trainer.model, "reducer"),
    }
    ranks: list[Any] = [None] * tdist.get_world_size()
    tdist.all_gather_object(ranks, mine)
    return lambda: {"ranks": ranks}


def test_every_rank_reads_the_weights_and_trains_like_rank0(two_rank_runs: TwoRankRuns) -> None:
    root = two_rank_runs.dir(__name__)
    rank0, path = root / "rank0", root / "path"
    assert "each of 2 rank(s) reads its own shards" in two_rank_runs.log(path)
    assert "reads its own shards" not in two_rank_runs.log(rank0)
    on_path = json.loads((path / "inspect.json").read_text())["ranks"]
    assert on_path == [{"read_here": True, "ddp_ready": True}] * 2
    broadcast = json.loads((rank0 / "inspect.json").read_text())["ranks"]
    assert broadcast == [{"read_here": False, "ddp_ready": True}] * 2
    assert sorted(losses(path)) == list(range(1, STEPS + 1))
    assert_close(losses(path), losses(rank0), 1e-6)


@pytest.mark.skipif(not _has_peft(), reason="hyper-train-peft not installed")
def test_lora_over_ddp_from_a_path_trains_like_one_process(two_rank_runs: TwoRankRuns) -> None:
    """The LoRA parameters are still on meta after the load: DDP is set up at the first
    forward, after the plugin gave them their values; the base weights stay frozen."""
    root = two_rank_runs.dir(__name__)
    one = root / "lora-one"
    train_here(_lora_config(root, one))
    assert "each of 2 rank(s) reads its own shards" in two_rank_runs.log(root / "lora")
    assert sorted(losses(one)) == list(range(1, STEPS + 1))
    assert_close(losses(root / "lora"), losses(one), 1e-6)
