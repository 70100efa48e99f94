"""The GPU step, lever by lever (issue #31): ``bash bench/gpu.sh matrix``.

Runs the true-shape Qwen2.5-VL-3B step (``bench/configs/qwen2_5_vl_3b_gpu.toml``: 8k packed
tokens, bf16 compute) once per lever, each adding one to the previous, then the 7B and MoE cases
with every lever on, each as its own ``hyper-train run`` process, under one deadline (default
8 minutes: a case that could not finish in the time left is skipped and says so). Writes
``bench/results/gpu/<device>_<date>.json`` and prints the table: seconds per step, tokens/s, MFU
and HFU (from ``metrics.jsonl``: the last log line, the steps after the first log's warm-up),
peak memory, attention fallbacks and graph breaks.

    python -m bench.gpu_matrix [--deadline-s 480] [--steps 10] [--only NAME ...] [--dry-run]

``--dry-run`` prints each case's command and runs nothing (no GPU needed); without it the
module exits 2 unless CUDA is available.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.util
import json
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import attrs

REPO = Path(__file__).resolve().parents[1]
DENSE = REPO / "bench" / "configs" / "qwen2_5_vl_3b_gpu.toml"
RESULTS = REPO / "bench" / "results" / "gpu"
#: A case is not started with less time left than this (start-up alone takes about a minute).
MIN_CASE_S = 75

#: The published Qwen2.5-VL-7B-Instruct shape (vocabulary 152,064, untied embeddings; the
#: override replaces the dense config's whole table), with bf16 weights: fp32 master weights
#: and AdamW state (16 bytes per parameter, 133 GB for 8.3B) fit no single GPU.
SEVEN_B = (
    "--model.dtype=bfloat16",
    "--model.hf_overrides={tie_word_embeddings = false, text_config = {vocab_size = 152064, "
    "hidden_size = 3584, intermediate_size = 18944, num_hidden_layers = 28, "
    "num_attention_heads = 28, num_key_value_heads = 4, max_position_embeddings = 128000, "
    'rope_parameters = {rope_type = "default", rope_theta = 1000000.0, '
    "mrope_section = [16, 24, 24]}}, vision_config = {depth = 32, hidden_size = 1280, "
    "intermediate_size = 3420, num_heads = 16, out_hidden_size = 3584, window_size = 112, "
    "fullatt_block_indexes = [7, 15, 23, 31]}}",
)
#: A Qwen3-VL-30B-A3B-shaped model cut to 8 layers (128 experts, top 8), 28 samples a step (~8k
#: tokens; the 2026-12-04 run had 8, ~1.7k, which measured little).
MOE = (
    "--model.adapter=qwen3_vl_moe",
    "--model.hf_overrides={text_config = {hidden_size = 2048, intermediate_size = 6144, "
    "moe_intermediate_size = 768, num_hidden_layers = 8, num_attention_heads = 32, "
    "num_key_value_heads = 4, head_dim = 128, num_experts = 128, num_experts_per_tok = 8, "
    "vocab_size = 151936}, vision_config = {hidden_size = 1152, intermediate_size = 4304, "
    "depth = 4, num_heads = 16, out_hidden_size = 2048}}",
)


@attrs.frozen
class Case:
    """One run of the matrix: overrides on the dense config."""

    name: str
    #: What this case changes, for the table.
    lever: str
    overrides: tuple[str, ...]
    #: Pick the activation-checkpointing policy by the memory estimate on this device.
    estimate_policy: bool = False
    #: A module the case needs (an optional package); skipped without it.
    needs: str | None = None


def cases(steps: int) -> list[Case]:
    """The baseline, each lever on top of the previous, then 7B and MoE with all levers."""
    common = (f"--training.steps={steps}", f"--logging.every_steps={max(steps // 2, 1)}")
    # The step as the 2026-12-04 run measured it: one GPU left the model unwrapped (fp32
    # weights under autocast), flash_varlen silently ran per-sample SDPA (what `varlen` runs),
    # every layer recomputed, nothing compiled.
    before = (*common, "--parallel.strategy=none", "--model.attn_implementation=varlen")
    kernel = (*common, "--parallel.strategy=none")
    bf16 = common  # the config: fsdp2 on a 1-rank mesh, bf16 parameters in compute
    compiled = (*bf16, "--training.compile=true")
    return [
        Case("baseline", "before #31 (fp32 weights, per-sample attention, full AC)", before),
        Case("flash_varlen", "+ varlen kernel under autocast", kernel),
        Case("fsdp2_bf16", "+ fsdp2 on one rank (bf16 compute dtypes)", bf16),
        Case("recompute", "+ the estimate's AC policy", bf16, estimate_policy=True),
        Case("compile", "+ compiled layers", compiled, estimate_policy=True),
        Case(
            "liger",
            "+ liger-kernel (norms, RoPE, SwiGLU)",
            (*compiled, "--training.liger_kernel=true"),
            estimate_policy=True,
            needs="liger_kernel",
        ),
        Case("dense_7b", "7B shape, bf16 weights, all levers", (*compiled, *SEVEN_B), True),
        Case("moe", "MoE 8 layers (128 experts), all levers", (*compiled, *MOE), True),
    ]


def command(case: Case, out: Path, policy: str | None) -> list[str]:
    """The ``hyper-train run`` argv of ``case`` writing to ``out``."""
    argv = [sys.executable, "-m", "hyper_core", "run", str(DENSE), f"--run.output_dir={out}"]
    argv += case.overrides
    if policy is not None:
        argv.append(f"--training.activation_checkpointing={policy}")
    return argv


def estimated_policy(case: Case, device_bytes: int) -> tuple[str | None, str]:
    """The memory estimate's recommended activation-checkpointing policy for ``case`` on a
    device of ``device_bytes``, and a note (the per-policy totals, or why none)."""
    argv = [sys.executable, "-m", "hyper_core", "memory", "estimate", str(DENSE), "--json"]
    argv += [f"--device-memory={device_bytes}B", "--tokens=8192", "--samples=28"]
    argv += ["--patches=28672", *(o for o in case.overrides if not o.startswith("--logging"))]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=300)
    if proc.returncode not in (0, 3):
        return None, f"estimate failed: {proc.stderr.strip()[-300:]}"
    report = json.loads(proc.stdout)
    totals = {k: round(v / 2**30, 1) for k, v in report["checkpointing_policies"].items()}
    return report.get("recommended_checkpointing"), f"estimate GiB by policy: {totals}"


#: The run's end lines this module reads.
_COMPILE = re.compile(r"torch\.compile: (\d+) graph\(s\), (\d+) recompile\(s\), (\d+) graph break")
_ATTENTION = re.compile(r"attention \((\w+)\): (\d+) call\(s\) on the kernel, (\d+) fell back")


def read_run(out: Path, log: str) -> dict[str, object]:
    """The figures of a finished run: its last ``metrics.jsonl`` training row, the compile
    and attention counts of its end lines."""
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    last = [r for r in rows if "loss" in r][-1]
    keys = ("step", "step_time_s", "tokens_per_s", "mfu", "hfu", "mem_peak_mib", "loss")
    result: dict[str, object] = {k: last[k] for k in keys if k in last}
    result["losses"] = [round(r["loss"], 4) for r in rows if "loss" in r]
    if found := _COMPILE.search(log):
        graphs, recompiles, breaks = (int(g) for g in found.groups())
        result.update(graphs=graphs, recompiles=recompiles, graph_breaks=breaks)
    if found := _ATTENTION.search(log):
        result.update(attn_kernel_calls=int(found[2]), attn_fallback_calls=int(found[3]))
    return result


def table(results: Sequence[dict[str, object]]) -> str:
    """The printed table, one line per case."""

    def cell(row: dict[str, object], key: str, fmt: str) -> str:
        value = row.get(key)
        return "-" if value is None else format(value, fmt)

    head = "case           s/step  tokens/s   MFU    HFU    peak GiB  fallbacks  breaks  status"
    lines = [head, "-" * len(head)]
    for row in results:
        peak = row.get("mem_peak_mib")
        lines.append(
            f"{row['case']:<14} {cell(row, 'step_time_s', '6.3f'):>6}  "
            f"{cell(row, 'tokens_per_s', ',.0f'):>8}  {cell(row, 'mfu', '.1%'):>5}  "
            f"{cell(row, 'hfu', '.1%'):>5}  "
            f"{'-' if peak is None else format(float(peak) / 1024, '.1f'):>8}  "
            f"{cell(row, 'attn_fallback_calls', 'd'):>9}  {cell(row, 'graph_breaks', 'd'):>6}  "
            f"{row['status']}"
        )
    return "\n".join(lines)


def result_path(device: str, date: str) -> Path:
    """``bench/results/gpu/<device>_<date>.json`` (``h200``, ``h100``...), never overwriting."""
    words = [w for w in device.lower().split() if w not in ("nvidia", "tesla")]
    slug = re.sub(r"[^a-z0-9]+", "-", words[0] if words else "gpu")
    path = RESULTS / f"{slug}_{date}.json"
    n = 2
    while path.exists():
        path, n = RESULTS / f"{slug}_{date}_{n}.json", n + 1
    return path


def run_case(case: Case, root: Path, deadline: float, device_bytes: int) -> dict[str, object]:
    """Run ``case`` within the time left; its figures, or why it has none."""
    row: dict[str, object] = {"case": case.name, "lever": case.lever}
    left = deadline - time.monotonic()
    if left < MIN_CASE_S:
        row["status"] = f"skipped: {left:.0f} s left of the deadline"
        return row
    if case.needs and importlib.util.find_spec(case.needs) is None:
        row["status"] = f"skipped: {case.needs} is not installed"
        return row
    policy = None
    if case.estimate_policy:
        policy, row["estimate"] = estimated_policy(case, device_bytes)
        if policy is None:
            row["status"] = "skipped: does not fit by the memory estimate"
            return row
        row["activation_checkpointing"] = policy
    out = root / case.name
    argv = command(case, out, policy)
    row["command"] = " ".join(argv[1:])
    t0 = time.monotonic()
    try:
        proc = subprocess.run(
            argv, capture_output=True, text=True, timeout=deadline - time.monotonic()
        )
    except subprocess.TimeoutExpired as exc:
        row["status"] = f"stopped by the deadline after {time.monotonic() - t0:.0f} s"
        log = exc.stderr.decode(errors="replace") if isinstance(exc.stderr, bytes) else ""
        row["log_tail"] = log[-2000:]
        return row
    row["wall_s"] = round(time.monotonic() - t0, 1)
    if proc.returncode != 0:
        row["status"] = f"failed (exit {proc.returncode})"
        row["log_tail"] = proc.stderr[-2000:]
        return row
    row.update(read_run(out, proc.stderr))
    row["status"] = "ok"
    return row


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.gpu_matrix", description=__doc__)
    parser.add_argument("--deadline-s", type=float, default=480.0)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--only", nargs="+", metavar="NAME", help="run only these cases")
    parser.add_argument("--dry-run", action="store_true", help="print the commands only")
    parser.add_argument("--out", type=Path, help="the JSON file (default: results/gpu/...)")
    args = parser.parse_args(argv)
    chosen = [c for c in cases(args.steps) if not args.only or c.name in args.only]
    if args.only and len(chosen) != len(set(args.only)):
        names = ", ".join(c.name for c in cases(args.steps))
        print(f"gpu_matrix: unknown case in {args.only}; the cases: {names}", file=sys.stderr)
        return 2
    if args.dry_run:
        for case in chosen:
            policy = "<estimate>" if case.estimate_policy else None
            print(" ".join(command(case, Path("RUN_DIR") / case.name, policy)[1:]))
        return 0
    import torch

    if not torch.cuda.is_available():
        print("gpu_matrix: no CUDA device; nothing measured", file=sys.stderr)
        return 2
    device = torch.cuda.get_device_name(0)
    device_bytes = torch.cuda.get_device_properties(0).total_memory
    deadline = time.monotonic() + args.deadline_s
    results = []
    with tempfile.TemporaryDirectory(prefix="gpu-matrix-") as root:
        for case in chosen:
            print(f"gpu_matrix: {case.name}: {case.lever}", file=sys.stderr, flush=True)
            results.append(run_case(case, Path(root), deadline, device_bytes))
            print(f"gpu_matrix: {case.name}: {results[-1]['status']}", file=sys.stderr)
    date = datetime.date.today().isoformat()
    record = {
        "command": "bash bench/gpu.sh matrix",
        "date": date,
        "device": f"{device}, torch {torch.__version__}",
        "deadline_s": args.deadline_s,
        "cases": results,
    }
    path = args.out or result_path(device, date)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, indent=1) + "\n")
    print(table(results))
    print(f"gpu_matrix: wrote {path}", file=sys.stderr)
    return 0 if all(r["status"] == "ok" for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
