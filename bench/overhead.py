"""Overhead: hyper-train's trainer vs a hand-written loop on the same model and batches.

Both sides use the same model object, the same optimizer and scheduler, and the same pre-built
micro-batches; they alternate in blocks of steps so that machine noise cancels. The hand loop is
what a careful user writes: move to device, forward, sum-CE / tokens, backward, clip, step,
scheduler step, zero_grad. Two hand loops: on the trainer's own model (``varlen`` attention:
the overhead of the trainer around the same math), and the plain packed loop (#21's
baseline): the same packed rows with per-sample positions, transformers' ``sdpa`` over each
row (one call per layer, a block-diagonal mask), logits at every position.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path
from typing import Any

from .runner import Ratio, Result, alternate

REPO = Path(__file__).resolve().parents[1]

#: A Qwen2.5-VL-shaped model of ~27M parameters (text 512 × 8 layers, vision 256 × 4).
MEDIUM_OVERRIDES: dict[str, Any] = {
    "text_config": {
        "hidden_size": 512,
        "intermediate_size": 1536,
        "num_hidden_layers": 8,
        "num_attention_heads": 8,
        "num_key_value_heads": 4,
        "rope_parameters": {
            "rope_type": "default",
            "rope_theta": 10000.0,
            "mrope_section": [16, 8, 8],
        },
    },
    "vision_config": {
        "hidden_size": 256,
        "intermediate_size": 512,
        "depth": 4,
        "num_heads": 4,
        "out_hidden_size": 512,
    },
}


def build_trainer(size_name: str, tmp: str, steps: int) -> Any:
    """A set-up trainer for the demo config, tiny or medium."""
    from hyper_core.config import load_config
    from hyper_core.testing import isolated_host
    from hyper_core.trainer.trainer import Trainer

    host = isolated_host(["hyper_qwen_vl.plugin"])
    overrides = [f"--run.output_dir={tmp}", "--logging.progress=none", f"--training.steps={steps}"]
    if size_name == "medium":
        overrides.append(f"--model.hf_overrides={_toml_inline(MEDIUM_OVERRIDES)}")
        overrides.append("--training.micro_batch_size=8")
    config = load_config(
        REPO / "configs" / "qwen2_5_vl_demo.toml", overrides, host.registries.config_sections
    )
    trainer = Trainer(config, host)
    trainer.setup()
    return trainer


def _toml_inline(value: Any) -> str:
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k} = {_toml_inline(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list):
        return "[" + ", ".join(_toml_inline(v) for v in value) + "]"
    if isinstance(value, str):
        return f'"{value}"'
    return repr(value)


def hand_step(trainer: Any, micro_batches: list[Any]) -> None:
    """The hand-written loop's step on the same objects."""
    import torch

    model, opt, sched = trainer.model, trainer.optimizer, trainer.lr_scheduler
    device = trainer.dist.device
    n_tokens = sum(mb.num_loss_tokens for mb in micro_batches)
    for mb in micro_batches:
        inputs = {k: v.to(device) if torch.is_tensor(v) else v for k, v in mb.model_inputs.items()}
        labels = mb.loss_inputs["labels"].to(device)
        logits = model(**inputs, use_cache=False).logits
        loss = (
            torch.nn.functional.cross_entropy(
                logits.float().flatten(0, -2), labels.flatten(), ignore_index=-100, reduction="sum"
            )
            / n_tokens
        )
        loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    sched.step()
    opt.zero_grad(set_to_none=True)


def hand_sdpa_step(trainer: Any, micro_batches: list[Any]) -> None:
    """The plain packed loop: :func:`hand_step` with transformers' ``sdpa`` over each row."""
    model = trainer.unwrapped_model
    previous = model.config._attn_implementation
    model.set_attn_implementation("sdpa")
    try:
        hand_step(trainer, micro_batches)
    finally:
        model.set_attn_implementation(previous)


def run(size: str = "full") -> Result:
    """Step-time ratio trainer/hand loop for the tiny demo model and the ~27M model."""
    from hyper_core.adapters.hf import count_params

    result = Result("overhead", "trainer step time vs a hand-written loop, same batches")
    block = 3 if size == "ci" else 10
    repeats = 2 if size == "ci" else 5
    sizes = ("tiny",) if size == "ci" else ("tiny", "medium")
    for name in sizes:
        with tempfile.TemporaryDirectory() as tmp:
            trainer = build_trainer(name, tmp, steps=10_000)
            data = iter(trainer.dataloaders.train)
            batches = [next(data) for _ in range(block)]
            result.params[f"{name}_params"] = count_params(trainer.model, exclude_embeddings=False)
            result.params[f"{name}_micro_batches_per_step"] = len(batches[0].micro_batches)
            for b in batches[:2]:  # warm up every path
                trainer.train_step(b)
                hand_step(trainer, b.micro_batches)
                hand_sdpa_step(trainer, b.micro_batches)

            def ours(trainer: Any = trainer, batches: list[Any] = batches) -> float:
                t0 = time.perf_counter()
                for b in batches:
                    trainer.train_step(b)
                return (time.perf_counter() - t0) / len(batches)

            def hand(trainer: Any = trainer, batches: list[Any] = batches) -> float:
                t0 = time.perf_counter()
                for b in batches:
                    hand_step(trainer, b.micro_batches)
                return (time.perf_counter() - t0) / len(batches)

            def plain(trainer: Any = trainer, batches: list[Any] = batches) -> float:
                t0 = time.perf_counter()
                for b in batches:
                    hand_sdpa_step(trainer, b.micro_batches)
                return (time.perf_counter() - t0) / len(batches)

            times = alternate(
                {"hyper_train": ours, "hand_loop": hand, "hand_packed_sdpa": plain}, repeats
            )
            result.figure(f"{name}_hyper_train_step", "s").values.extend(times["hyper_train"])
            result.figure(f"{name}_hand_loop_step", "s").values.extend(times["hand_loop"])
            result.figure(f"{name}_hand_packed_sdpa_step", "s").values.extend(
                times["hand_packed_sdpa"]
            )
            goal = "<= 1.03" if name == "medium" else None
            result.ratios[f"{name}_step_ratio"] = Ratio(
                f"{name}_hyper_train_step", f"{name}_hand_loop_step", goal
            )
            # speed-up over the plain packed loop (its step time over ours)
            result.ratios[f"{name}_speedup_vs_packed_sdpa"] = Ratio(
                f"{name}_hand_packed_sdpa_step",
                f"{name}_hyper_train_step",
                ">= 1.25" if name == "medium" else None,
            )
            trainer._teardown()
    return result
