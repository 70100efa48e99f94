"""``[checkpoint] export_hf``: the HF layout that ``from_pretrained`` loads, sharded when large."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from dist_helpers import probe_logits, text_config, train_here


def test_export_hf_logits_equal_the_trained_model(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    import hyper_core.export

    # A tiny shard limit, so that the sharded layout (index + several files) is what loads.
    monkeypatch.setattr(hyper_core.export, "MAX_SHARD_SIZE", "100KB")
    run = train_here(text_config(tmp_path, training={"steps": 3}, checkpoint={"export_hf": True}))
    hf = tmp_path / "hf"
    index = json.loads((hf / "model.safetensors.index.json").read_text())
    shards = set(index["weight_map"].values())
    assert len(shards) > 1 and all((hf / s).is_file() for s in shards)
    assert json.loads((hf / "config.json").read_text())["model_type"] == "qwen2"
    AutoTokenizer.from_pretrained(hf, local_files_only=True)  # tokenizer files written

    trained = probe_logits(run.trainer.unwrapped_model)
    loaded = AutoModelForCausalLM.from_pretrained(hf, local_files_only=True)
    torch.testing.assert_close(probe_logits(loaded), trained, atol=1e-5, rtol=0)
    # The weights are the trained ones, not a fresh init.
    fresh = train_here(text_config(tmp_path / "fresh", training={"steps": 1}))
    assert not torch.allclose(probe_logits(fresh.trainer.unwrapped_model), trained, atol=1e-3)
