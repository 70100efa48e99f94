"""Packing: padding fraction and real tokens per micro-batch, padded vs packed.

Two length distributions: the multimodal demo data (through the real adapter transform) and
a long-tailed SFT-like one (log-normal lengths, median ~250 tokens, capped at 4096).
"""

from __future__ import annotations

import random
import statistics
import tempfile
from pathlib import Path

from .runner import Ratio, Result

REPO = Path(__file__).resolve().parents[1]


def _long_tailed(n: int, seed: int = 0) -> list:
    import torch

    from hyper_core.batching.types import SampleFeatures

    rng = random.Random(seed)
    out = []
    for _ in range(n):
        length = min(4096, max(16, int(rng.lognormvariate(5.5, 0.9))))
        ids = torch.randint(3, 1000, (length,))
        labels = ids.clone()
        labels[: length // 2] = -100
        out.append(SampleFeatures(input_ids=ids, labels=labels))
    return out


def _demo_features(n: int) -> list:
    from hyper_core.config import load_config
    from hyper_core.plugins import PluginHost
    from hyper_core.trainer.trainer import Trainer

    host = PluginHost()
    cfg = REPO / "configs" / "qwen2_5_vl_demo.toml"
    if "qwen2_5_vl" not in host.registries.model_adapters:
        cfg = REPO / "configs" / "text_demo.toml"
    with tempfile.TemporaryDirectory() as tmp:
        config = load_config(cfg, [f"--run.output_dir={tmp}"], host.registries.config_sections)
        trainer = Trainer(config, host)
        trainer.setup()
        ds = trainer.datasets.train
        feats = [ds[i] for i in range(min(n, len(ds)))]
        trainer._teardown()
    return [f for f in feats if hasattr(f, "input_ids")], cfg.name


def _measure(features: list, micro: int, result: Result, tag: str) -> None:
    from hyper_core.batching.base import BatchingOptions
    from hyper_core.batching.packed import PackedRuntime
    from hyper_core.batching.padded import PaddedRuntime

    opts = BatchingOptions(micro_batch_size=micro, max_seq_len=8192, pad_token_id=0)
    for name, runtime in (("padded", PaddedRuntime(opts)), ("packed", PackedRuntime(opts))):
        mbs = runtime.collate(features)
        real = sum(mb.num_tokens for mb in mbs)
        pad = sum(mb.num_padding for mb in mbs)
        result.figure(f"{tag}_{name}_padding_fraction", "fraction").values.append(
            pad / (real + pad)
        )
        result.figure(f"{tag}_{name}_real_tokens_per_micro_batch", "tokens").values.append(
            statistics.mean(mb.num_tokens for mb in mbs)
        )
        result.figure(f"{tag}_{name}_positions_per_micro_batch", "positions").values.append(
            statistics.mean(mb.num_tokens + mb.num_padding for mb in mbs)
        )


def run(size: str = "full") -> Result:
    """Both distributions, micro-batches of 8 (long-tailed) and 16 (demo)."""
    n = 128 if size == "ci" else 2000
    result = Result("packing", "padding and real tokens per micro-batch, padded vs packed")
    demo, cfg = _demo_features(n)
    _measure(demo, 16, result, "demo")
    _measure(_long_tailed(n), 8, result, "sft")
    result.params.update(samples=n, demo_config=cfg, sft_micro_batch=8, demo_micro_batch=16)
    goal = result.figure("goal_5pct", "fraction")
    goal.values.append(0.05)
    result.ratios["sft_packed_padding_vs_5pct"] = Ratio(
        "sft_packed_padding_fraction", "goal_5pct", "< 1"
    )
    return result
