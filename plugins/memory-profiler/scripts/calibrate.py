"""Calibrate the activation formula: estimate vs measured saved-for-backward bytes.

Runs one step of tiny CPU models under several precisions and attention set-ups with the
memory profiler on, and prints a Markdown table (estimate, measured, ratio) per case:

    .venv/bin/python plugins/memory-profiler/scripts/calibrate.py [--out DIR] [CASE ...]

Needs hyper-train-qwen-vl for the VL cases. Takes about a minute on two cores.
"""

from __future__ import annotations

import argparse
import json
import logging
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
TEXT = str(REPO / "configs" / "text_demo.toml")
VL = """\
[model]
adapter = "qwen2_5_vl"
config = "tiny"
[data]
train = { format = "shapes", num_samples = 16, image_size = 56 }
max_seq_len = 256
batching = "packed"
[training]
steps = 1
global_batch_size = 2
micro_batch_size = 2
lr = 1e-3
"""
BF16 = '--training.mixed_precision="bf16"'
AC = "--training.activation_checkpointing=true"
CHUNK = "--training.loss_chunk_tokens=8"
EVERY = '--training.activation_checkpointing="every_n"'
SELECTIVE = '--training.activation_checkpointing="selective"'
VISION_FULL = '--training.vision_activation_checkpointing="full"'

CASES: list[tuple[str, str, list[str]]] = [
    ("text", "text tiny-qwen2, fp32, packed ×8", []),
    ("text", "text tiny-qwen2, bf16 autocast", [BF16]),
    ("text", "text tiny-qwen2, 1 sample (no mask)", ["--training.micro_batch_size=1"]),
    ("text", "text tiny-qwen2, eager attention", ['--model.attn_implementation="eager"']),
    ("text", "text tiny-qwen2, checkpointing", [AC]),
    ("text", "text tiny-qwen2, chunked loss (8 rows)", [CHUNK]),
    ("text", "text tiny-qwen2, chunked loss, bf16 autocast", [CHUNK, BF16]),
    ("vl", "qwen2.5-vl tiny, fp32", []),
    ("vl", "qwen2.5-vl tiny, bf16 autocast", [BF16]),
    ("vl", "qwen2.5-vl tiny, bf16 weights", ['--model.dtype="bfloat16"']),
    ("vl", "qwen2.5-vl tiny, checkpointing", [AC]),
    ("vl", "qwen2.5-vl tiny, checkpointing + bf16", [AC, BF16]),
    ("vl", "qwen2-vl tiny, fp32", ['--model.adapter="qwen2_vl"']),
    ("vl", "qwen3-vl tiny, fp32", ['--model.adapter="qwen3_vl"']),
    ("vl", "qwen3-vl tiny, bf16 autocast", ['--model.adapter="qwen3_vl"', BF16]),
    ("text", "text tiny-qwen2, every_n (N = 2)", [EVERY]),
    ("text", "text tiny-qwen2, selective", [SELECTIVE]),
    ("text", "text tiny-qwen2, selective + bf16", [SELECTIVE, BF16]),
    ("vl", "qwen2.5-vl tiny, every_n (N = 2)", [EVERY]),
    ("vl", "qwen2.5-vl tiny, selective", [SELECTIVE]),
    ("vl", "qwen2.5-vl tiny, selective LM, full vision", [SELECTIVE, VISION_FULL]),
]


def main() -> None:
    """Run the cases and print the table."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("cases", nargs="*", type=int, help="case numbers (default: all)")
    parser.add_argument("--out", default=None, help="where the runs go (default: a temp dir)")
    args = parser.parse_args()
    logging.disable(logging.WARNING)
    from hyper_core.config import load_config
    from hyper_core.plugins.manager import PluginHost
    from hyper_core.trainer.run import run_training

    out = Path(args.out or tempfile.mkdtemp(prefix="hyper-train-calibrate-"))
    vl_config = out / "vl.toml"
    out.mkdir(parents=True, exist_ok=True)
    vl_config.write_text(VL)
    mib = 2.0**20
    print(
        "| case | micro-batch | activations est. MiB | measured MiB | measured/est. "
        "| weight copies est. | measured |"
    )
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: |")
    for i, (kind, name, overrides) in enumerate(CASES):
        if args.cases and i not in args.cases:
            continue
        host = PluginHost()
        run_dir = out / f"case{i}"
        base = [
            "--training.steps=1",
            f'--run.output_dir="{run_dir}"',
            '--checkpoint.resume="none"',
            "--memory_profiler.enabled=true",
            "--memory_profiler.steps=[1]",
            "--memory_profiler.plot=false",
        ]
        if kind == "text":
            base += ["--data.eval_samples=16"]
        path = TEXT if kind == "text" else str(vl_config)
        config = load_config(path, base + overrides, host.registries.config_sections)
        run_training(config, host)
        summary = json.loads((run_dir / "memory" / "summary.json").read_text())
        comp = summary["comparison"]
        batch = summary["ranks"][0]["steps"][0]["batch"]
        acts, copies = comp["activations"], comp["weight_copies"]
        shape = f"{batch['rows']}×{batch['seq_len']}, {batch['patches']} patches"
        print(
            f"| {name} | {shape} | {acts['estimate'] / mib:.3f} | {acts['measured'] / mib:.3f} "
            f"| {acts['ratio']:.3f} | {copies['estimate'] / mib:.3f} "
            f"| {(copies['measured'] or 0) / mib:.3f} |",
            flush=True,
        )


if __name__ == "__main__":
    main()
