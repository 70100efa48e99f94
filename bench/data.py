"""Data: time to the first step and peak RSS against the training file's size, eager vs lazy.

The tiny text model trains 1 step on a generated text-SFT file of N lines (1k / 100k / 1M;
ci: 1k / 20k), once as ``.jsonl`` (read lazily through the cached line index) and once as
``.json`` (the same JSON lines, read whole into Python dicts: the eager path), with one
DataLoader worker. Each run is its own process: seconds from building the trainer to the end
of the first step (a cold index: the cache is emptied before each run), and the peak RSS of
the main process and of its worker at that point. The overhead figures subtract the 1k run.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import attrs

from .runner import Result

_CHILD = r"""
import json, multiprocessing, re, sys, time
from pathlib import Path
from hyper_core import hookimpl
from hyper_core.testing import run_tiny_training, tiny_text_config

def hwm(pid="self"):
    text = Path(f"/proc/{pid}/status").read_text()
    return int(re.search(r"^VmHWM:\s+(\d+) kB", text, re.M).group(1)) * 1024

record = {}

class FirstStep:
    @hookimpl
    def on_step_end(self, trainer, state, loss, loss_dict, grad_norm):
        if "seconds" not in record:
            record["seconds"] = time.perf_counter() - t0
            record["main_peak"] = hwm()
            workers = [p.pid for p in multiprocessing.active_children()]
            record["worker_peak"] = max((hwm(pid) for pid in workers), default=0)

path, out = sys.argv[1], sys.argv[2]
config = tiny_text_config(
    out,
    data={"train": path, "num_workers": 1},
    training={"steps": 1},
    checkpoint={"every_steps": None},
)
t0 = time.perf_counter()
run_tiny_training(config, plugins=[FirstStep()])
print(json.dumps(record))
"""


def write_text_sft(path: Path, lines: int) -> Path:
    """``lines`` JSON lines of short user/assistant turns (varied, deterministic)."""
    with path.open("w") as f:
        for i in range(lines):
            row = {
                "messages": [
                    {"role": "user", "content": f"What comes after {i}?"},
                    {"role": "assistant", "content": str(i + 1)},
                ]
            }
            f.write(json.dumps(row) + "\n")
    return path


def first_step(path: Path, workdir: Path, cache: Path) -> dict[str, Any]:
    """Run the child on ``path`` with an empty index cache; its record."""
    import os
    import shutil

    shutil.rmtree(cache, ignore_errors=True)
    env = {**os.environ, "HYPER_TRAIN_CACHE": str(cache), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(
        [sys.executable, "-c", _CHILD, str(path), str(workdir)],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    if proc.returncode != 0:
        raise RuntimeError(proc.stderr[-3000:])
    return json.loads(proc.stdout.strip().splitlines()[-1])


def long_tailed_lengths(n: int, seed: int = 0) -> list[int]:
    """Sample lengths with a long tail (lognormal, median ~300 tokens, capped at 4096), like
    mixed SFT data: many short chats, a few long documents."""
    import numpy as np

    rng = np.random.default_rng(seed)
    return [int(x) for x in np.clip(rng.lognormal(5.7, 0.9, n), 16, 4096)]


def token_budget_figures(result: Result, samples: int = 8192) -> None:
    """Tokens per micro-batch and max/mean tokens per rank per step, fixed-count micro-batches
    (8 samples) vs a 4096-token budget (at most 32 samples), 2 ranks, 64 samples per step, on
    :func:`long_tailed_lengths`: the plans a run makes (``hyper_core.data.stats``). Then the
    look-ahead buffer (``[data] buffer_size``) of 1 step vs 8 steps: the budget's micro-batches
    and tokens per micro-batch, and the padding of ``padded`` micro-batches of 8 samples."""
    import statistics

    from hyper_core.data.stats import (
        Batching,
        buffered_order,
        micro_batch_groups,
        predict_padding,
        token_budget_plan,
    )

    lengths = long_tailed_lengths(samples)
    fixed = Batching(global_batch_size=64, micro_batch_size=8, world_size=2)
    budget = Batching(global_batch_size=64, micro_batch_size=32, world_size=2, max_tokens=4096)
    fixed_sizes = [sum(g) for g in micro_batch_groups(lengths, fixed)]
    plan = token_budget_plan(lengths, budget)
    budget_sizes = [t for step in plan for rank in step for t in rank]

    def per_rank(step_totals: list[list[int]]) -> float:
        return max(max(t) * len(t) / sum(t) for t in step_totals if sum(t))

    steps = len(lengths) // 64
    fixed_ranks = [
        [sum(lengths[s * 64 + r * 32 : s * 64 + (r + 1) * 32]) for r in range(2)]
        for s in range(steps)
    ]
    budget_ranks = [[sum(rank) for rank in step] for step in plan]
    for name, sizes, ranks in (
        ("fixed8", fixed_sizes, fixed_ranks),
        ("budget4096", budget_sizes, budget_ranks),
    ):
        result.figure(f"{name}_tokens_per_micro_batch_min", "tokens").values.append(min(sizes))
        result.figure(f"{name}_tokens_per_micro_batch_median", "tokens").values.append(
            statistics.median(sizes)
        )
        result.figure(f"{name}_tokens_per_micro_batch_max", "tokens").values.append(max(sizes))
        result.figure(f"{name}_micro_batches", "count").values.append(len(sizes))
        result.figure(f"{name}_rank_tokens_max_over_mean", "ratio").values.append(per_rank(ranks))
    result.notes.append("goal: token-budget max/mean tokens per rank per step <= 1.05")
    for steps in (1, 8):
        grouped = buffered_order(lengths, attrs.evolve(budget, buffer_steps=steps))
        plan = token_budget_plan(grouped, budget)
        sizes = [t for step in plan for rank in step for t in rank]
        by_length = buffered_order(lengths, attrs.evolve(fixed, buffer_steps=steps))
        padded = predict_padding(by_length, fixed)["padded"]
        name = f"buffer{steps}"
        result.figure(f"{name}_budget4096_micro_batches", "count").values.append(len(sizes))
        for stat, value in (
            ("min", min(sizes)),
            ("median", statistics.median(sizes)),
            ("max", max(sizes)),
        ):
            result.figure(
                f"{name}_budget4096_tokens_per_micro_batch_{stat}", "tokens"
            ).values.append(value)
        result.figure(f"{name}_budget4096_rank_tokens_max_over_mean", "ratio").values.append(
            per_rank([[sum(rank) for rank in step] for step in plan])
        )
        result.figure(f"{name}_padded8_padding", "tokens").values.append(padded.padding)
        result.figure(f"{name}_padded8_padding_ratio", "ratio").values.append(padded.ratio)


_LONG_WORDS = """the a of to and in is it that what which how why where when with for from by as
red green blue circle square triangle left right top bottom image shape colour small large
question answer describe because therefore however, first second then finally. 42 3.14 (x) über
naïve 形 — "quoted" it's don't e.g. i.e. self-attention tokenizer multi-turn\n"""


def long_multi_turn(n: int, turns: int = 16, seed: int = 0) -> list[dict[str, Any]]:
    """``n`` conversations of ``turns`` user/assistant pairs, 20-120 words a message
    (deterministic)."""
    import random

    rng = random.Random(seed)
    words = _LONG_WORDS.split()

    def text() -> str:
        return " ".join(rng.choice(words) for _ in range(rng.randint(20, 120)))

    return [
        {
            "messages": [
                {"role": role, "content": text()}
                for _ in range(turns)
                for role in ("user", "assistant")
            ]
        }
        for _ in range(n)
    ]


def transform_figures(result: Result, samples: int = 2000, repeats: int = 3) -> None:
    """Samples/s of the chat transform on the text demo data (``samples``) and on long
    multi-turn samples (``samples // 20``), one-pass and piecewise, best of ``repeats`` timed
    passes each after an untimed one (imports; the piecewise path's piece cache filled, as in
    a long run)."""
    import time

    from hyper_core.builtin.hf_causal_lm import HFCausalLMAdapter
    from hyper_core.config.schema import ModelConfig
    from hyper_core.data import text_demo
    from hyper_core.data.chat import QWEN_CHATML, to_features, tokenize_conversation
    from hyper_core.data.conversation import parse_conversation

    tokenizer = (
        HFCausalLMAdapter()
        .build_assets(ModelConfig(adapter="hf_causal_lm", config="tiny-qwen2"))
        .tokenizer
    )
    demo = [json.loads(line) for line in text_demo.render(samples, "bench").splitlines()]
    data = {"demo": demo, "long_multi_turn": long_multi_turn(max(1, samples // 20))}
    for name, rows in data.items():
        tokens = 0
        for mode, piecewise in (("one_pass", False), ("piecewise", True)):
            best = float("inf")
            for repeat in range(repeats + 1):
                t0 = time.perf_counter()
                for row in rows:
                    tokenized = tokenize_conversation(
                        parse_conversation(row),
                        tokenizer,
                        QWEN_CHATML,
                        max_seq_len=1 << 20,
                        piecewise=piecewise,
                    )
                    to_features(tokenized)
                    tokens += tokenized.length
                if repeat:
                    best = min(best, time.perf_counter() - t0)
            result.figure(f"transform_{name}_{mode}", "samples/s").values.append(len(rows) / best)
        mean = tokens / (2 * (repeats + 1) * len(rows))
        result.figure(f"transform_{name}_mean_tokens", "tokens").values.append(mean)
    result.notes.append(
        "transform_*: the chat transform's samples/s (best of passes), one-pass vs piecewise"
    )


def run(size: str = "full") -> Result:
    """Each (N, eager/lazy) once; the overhead over the 1k run of the same reader; the
    token-budget plan on long-tailed lengths."""
    sizes = (1_000, 20_000) if size == "ci" else (1_000, 100_000, 1_000_000)
    result = Result("data", "time to first step and peak RSS vs training-file size, 1 worker")
    token_budget_figures(result)
    transform_figures(result, samples=400 if size == "ci" else 4000)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        base: dict[str, dict[str, Any]] = {}
        for n in sizes:
            jsonl = write_text_sft(root / f"train-{n}.jsonl", n)
            eager = root / f"train-{n}.json"
            jsonl.rename(eager)
            jsonl = write_text_sft(root / f"train-{n}.jsonl", n)
            for mode, path in (("lazy", jsonl), ("eager", eager)):
                rec = first_step(path, root / f"run-{mode}-{n}", root / "cache")
                if n == sizes[0]:
                    base[mode] = rec
                label = f"{mode}_{n}"
                result.figure(f"{label}_first_step", "s").values.append(rec["seconds"])
                result.figure(f"{label}_main_peak_rss", "bytes").values.append(rec["main_peak"])
                result.figure(f"{label}_worker_peak_rss", "bytes").values.append(rec["worker_peak"])
                if n != sizes[0]:
                    ref = base[mode]
                    for key, unit in (("seconds", "s"), ("main_peak", "bytes")):
                        result.figure(f"{label}_{key}_over_1k", unit).values.append(
                            rec[key] - ref[key]
                        )
                    result.figure(f"{label}_worker_peak_over_1k", "bytes").values.append(
                        rec["worker_peak"] - ref["worker_peak"]
                    )
    result.notes.append("goals (1M lazy): first-step overhead <= 3 s, <= 150 MB RSS over 1k")
    return result
