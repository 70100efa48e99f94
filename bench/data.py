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


def run(size: str = "full") -> Result:
    """Each (N, eager/lazy) once; the overhead over the 1k run of the same reader."""
    sizes = (1_000, 20_000) if size == "ci" else (1_000, 100_000, 1_000_000)
    result = Result("data", "time to first step and peak RSS vs training-file size, 1 worker")
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
