"""Preference training: forward + backward of one micro-batch of shapes pairs on the CPU demo's
tiny Qwen2.5-VL (tiny-558k, random init; hyper-train-preference): SFT on the pairs' chosen
sides (16 sequences), DPO with each sequence encoding its own image (32 sequences, 32 images),
and DPO with each pair's image encoded once for both sides (32 sequences, 16 images).

The reference forward is left out (its cost depends on the mode: none with ``precompute``, and
the same images-once saving with ``copy`` or ``adapters_off``). One thread, interleaved.
"""

from __future__ import annotations

import time
from typing import Any

from .runner import Ratio, Result, alternate


def _setup(pairs: int) -> dict[str, Any]:
    import torch

    from hyper_core.batching.resolve import resolve_runtime
    from hyper_core.config import load_config_dict
    from hyper_core.demo.shapes import ShapesOptions
    from hyper_core.plugins import get_plugin_host
    from hyper_core.resolve import resolve_adapter
    from hyper_core.step.label_positions import keep_label_positions
    from hyper_core.step.loss import causal_lm_loss
    from hyper_preference.batching import PairBatching
    from hyper_preference.config import PreferenceConfig
    from hyper_preference.data import PairTransform
    from hyper_preference.loss import pair_terms, sequence_logps
    from hyper_preference.shapes import load_shapes_pairs_format
    from hyper_preference.vision import SharedImages

    host = get_plugin_host()
    raw = {
        "run": {"output_dir": "/tmp/hyper-train-bench-preference"},
        "model": {"adapter": "qwen2_5_vl", "config": "tiny-558k", "attn_implementation": "varlen"},
        "data": {"train": "unused.jsonl", "max_seq_len": 256, "batching": "packed"},
        "training": {"global_batch_size": pairs, "micro_batch_size": pairs, "steps": 1, "lr": 1e-3},
        "preference": {"loss": "sigmoid"},
    }
    config = load_config_dict(raw, sections=host.registries.config_sections)
    adapter = resolve_adapter(config.model, host.registries)
    assets = adapter.build_assets(config.model)
    torch.manual_seed(0)
    model = adapter.build_model(config.model).train()
    spec = adapter.parallel_plan(model).vision_encoder
    SharedImages(adapter, spec).install(model)
    transform = PairTransform(lambda s: adapter.transform(s, assets=assets, max_seq_len=256))
    samples = load_shapes_pairs_format(None, ShapesOptions(num_samples=pairs, split="eval"), ".")
    features = [transform(s) for s in samples]
    runtime = resolve_runtime(config, adapter, assets, host.registries)
    cfg = PreferenceConfig(loss="sigmoid")
    kwargs = adapter.forward_kwargs()

    def dpo(mb: Any) -> float:
        model_inputs, loss_inputs = runtime.to_device(mb, torch.device("cpu"))
        t0 = time.perf_counter()
        policy = sequence_logps(model(**model_inputs, **kwargs).logits, loss_inputs)
        pair_terms(cfg, policy, policy.logps.detach()).losses.sum().backward()
        seconds = time.perf_counter() - t0
        model.zero_grad(set_to_none=True)
        return seconds

    def sft(mb: Any) -> float:
        model_inputs, loss_inputs = runtime.to_device(mb, torch.device("cpu"))
        t0 = time.perf_counter()
        loss, _ = causal_lm_loss(model(**model_inputs, **kwargs), loss_inputs, 1.0)
        loss.backward()
        seconds = time.perf_counter() - t0
        model.zero_grad(set_to_none=True)
        return seconds

    once = keep_label_positions(PairBatching(runtime, spec).collate(features)[0])
    each = keep_label_positions(PairBatching(runtime, None).collate(features)[0])
    chosen = keep_label_positions(runtime.collate([f.chosen for f in features])[0])
    return {
        "sft_chosen": lambda: sft(chosen),
        "dpo_images_each": lambda: dpo(each),
        "dpo_images_once": lambda: dpo(once),
    }


def run(size: str = "full") -> Result:
    """Each variant ``repeats`` times, interleaved, after one warm-up each."""
    import torch

    pairs = 4 if size == "ci" else 16
    repeats = 2 if size == "ci" else 10
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        sides = _setup(pairs)
        for fn in sides.values():
            fn()
        times = alternate(sides, repeats)
    finally:
        torch.set_num_threads(threads)
    result = Result("preference", f"forward + backward of {pairs} shapes pairs, tiny Qwen2.5-VL")
    result.params = {"pairs": pairs, "model": "qwen2_5_vl tiny-558k", "image_size": 112}
    for name, values in times.items():
        result.figure(f"{name}_seconds", "s").values.extend(values)
    result.ratios["images_once_vs_each"] = Ratio(
        "dpo_images_once_seconds", "dpo_images_each_seconds", "< 1.0"
    )
    result.ratios["dpo_vs_sft"] = Ratio("dpo_images_once_seconds", "sft_chosen_seconds")
    result.notes.append("no reference forward; one intra-op thread")
    return result
