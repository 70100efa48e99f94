"""Export from a 2-rank fsdp2 run, streamed group by group from the shards (``[checkpoint]
export_hf``) and from its DCP checkpoint (``hyper-train export``): ``from_pretrained`` gives
the trained weights and logits, for a tied-embedding text model, Qwen2.5-VL and Kimi-K2.5."""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any

import pytest
from dist_helpers import (
    TwoRankRuns,
    kimi_available,
    model_config,
    vl_available,
)

pytestmark = pytest.mark.slow
TWO_RANK_TIMEOUT_S = 400

STEPS = 3
MODELS = [
    "text",  # tied embeddings
    pytest.param("vl", marks=pytest.mark.skipif(not vl_available(), reason="no qwen-vl")),
    pytest.param("kimi", marks=pytest.mark.skipif(not kimi_available(), reason="no kimi")),
]
#: Text-only probe ids clear of every tiny tokenizer's special (image) tokens.
PROBE_IDS = list(range(20, 52))


def _config(model: str, out: Path) -> dict[str, Any]:
    return model_config(
        model,
        out,
        training={"steps": STEPS},
        parallel={"strategy": "fsdp2", "timeout_s": 120},
        checkpoint={"every_steps": STEPS, "keep_last": None, "export_hf": True},
    )


def _models() -> list[str]:
    return ["text"] + (["vl"] if vl_available() else []) + (["kimi"] if kimi_available() else [])


def two_rank_jobs(root: Path) -> list[dict[str, Any]]:
    """This module's jobs of the shared 2-rank launch (``conftest.two_rank_runs``)."""
    models = _models()
    return [{"config": _config(model, root / model), "probe": model == "text"} for model in models]


@pytest.fixture(scope="module")
def runs(two_rank_runs: TwoRankRuns) -> dict[str, Path]:
    out = {model: two_rank_runs.dir(__name__) / model for model in _models()}
    for path in out.values():
        log = two_rank_runs.log(path)
        assert log.count("export: wrote shard") >= 1, log[-3000:]
    return out


def _checkpoint_model(out: Path) -> Any:
    """The run's final DCP checkpoint, loaded whole in this process (the reference)."""
    import torch.distributed.checkpoint as dcp

    from hyper_core.config import load_config
    from hyper_core.parallel.materialize import materialize
    from hyper_core.plugins import get_plugin_host
    from hyper_core.resolve import resolve_adapter

    host = get_plugin_host()
    config = load_config(out / "config.toml", [], host.registries.config_sections)
    adapter = resolve_adapter(config.model, host.registries)
    model = adapter.build_model(config.model, device="meta")
    materialize(model, "cpu")
    state = {"model": model.state_dict()}
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r"torch\.distributed is disabled")
        dcp.load(state, checkpoint_id=str(out / "checkpoints" / f"step-{STEPS}"), no_dist=True)
    model.load_state_dict(state["model"])
    return model.eval()


def _logits(model: Any) -> Any:
    import torch

    with torch.no_grad():
        ids = torch.tensor([PROBE_IDS])
        return model(input_ids=ids, use_cache=False).logits.float()


def _assert_same_model(loaded: Any, reference: Any) -> None:
    import torch

    ours, ref = loaded.state_dict(), reference.state_dict()
    assert ours.keys() == ref.keys()
    for name, tensor in ref.items():
        assert torch.equal(ours[name], tensor), name
    torch.testing.assert_close(_logits(loaded.eval()), _logits(reference), atol=1e-5, rtol=0)


@pytest.mark.parametrize("model", MODELS)
def test_export_hf_from_fsdp2_shards_loads_the_trained_model(
    runs: dict[str, Path], model: str
) -> None:
    import torch

    out = runs[model]
    reference = _checkpoint_model(out)
    loaded = type(reference).from_pretrained(str(out / "hf"), local_files_only=True)
    _assert_same_model(loaded, reference)
    if model == "text":  # the live sharded model of the run, not only its checkpoint
        trained = torch.load(out / "probe_logits.pt")
        with torch.no_grad():
            ids = torch.tensor([list(range(3, 35))])
            got = loaded(input_ids=ids, use_cache=False).logits.float()
        torch.testing.assert_close(got, trained, atol=1e-5, rtol=0)
        weights = set()
        for file in (out / "hf").glob("*.safetensors"):
            from safetensors import safe_open

            with safe_open(str(file), "pt") as f:
                weights.update(f.keys())
        assert "lm_head.weight" not in weights  # tied, as save_pretrained writes it


@pytest.mark.parametrize("model", MODELS)
def test_export_command_on_the_two_rank_checkpoint_in_small_shards(
    runs: dict[str, Path], model: str, tmp_path: Path
) -> None:
    from hyper_core.cli import main

    out = runs[model]
    target = tmp_path / "hf"
    ckpt = out / "checkpoints" / f"step-{STEPS}"
    assert main(["export", str(ckpt), "--out", str(target), "--max-shard-size", "60KB"]) == 0
    index = json.loads((target / "model.safetensors.index.json").read_text())
    shards = set(index["weight_map"].values())
    assert len(shards) > 2 and shards == {p.name for p in target.glob("*.safetensors")}
    reference = _checkpoint_model(out)
    loaded = type(reference).from_pretrained(str(target), local_files_only=True)
    _assert_same_model(loaded, reference)
