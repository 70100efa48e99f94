"""Helpers of the distributed tests: tiny configs, torchrun/CLI subprocesses, metrics."""

from __future__ import annotations

import functools
import importlib.util
import json
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

import attrs
import pytest

from hyper_core.testing import processes, tiny_text_config

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]


def vl_available() -> bool:
    """Whether the Qwen-VL adapter distribution is importable."""
    return importlib.util.find_spec("hyper_qwen_vl") is not None


def kimi_available() -> bool:
    """Whether the Kimi adapter distribution is importable."""
    return importlib.util.find_spec("hyper_kimi_k26") is not None


#: Model families the equivalence tests run on; the adapter ones when they are installed
#: (``scripts/setup.sh`` installs them all).
MODELS = [
    "text",
    pytest.param(
        "vl",
        marks=pytest.mark.skipif(not vl_available(), reason="hyper-train-qwen-vl not installed"),
    ),
    pytest.param(
        "kimi",
        marks=pytest.mark.skipif(not kimi_available(), reason="hyper-train-kimi-k26 not installed"),
    ),
]


def _merge(cfg: dict[str, Any], sections: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    for name, values in sections.items():
        cfg.setdefault(name, {}).update(values)
    return cfg


def text_config(out: Path, **sections: Mapping[str, Any]) -> dict[str, Any]:
    """Tiny ``hf_causal_lm``/``tiny-qwen2`` run: 10 steps of 8 samples, 2 per micro-batch,
    clipping at 1.0 (active: the norms are ~3), logging every step."""
    cfg = tiny_text_config(
        out,
        training={"steps": 10, "global_batch_size": 8, "micro_batch_size": 2},
    )
    return _merge(cfg, sections)


def vl_config(out: Path, **sections: Mapping[str, Any]) -> dict[str, Any]:
    """Tiny ``qwen2_5_vl``/``tiny`` run on 64 synthetic ``shapes`` samples."""
    cfg: dict[str, Any] = {
        "run": {"output_dir": str(out), "seed": 0},
        "model": {"adapter": "qwen2_5_vl", "config": "tiny"},
        "data": {"train": {"format": "shapes", "num_samples": 64}, "max_seq_len": 512},
        "training": {
            "steps": 10,
            "global_batch_size": 8,
            "micro_batch_size": 2,
            "lr": 1e-3,
            "warmup_steps": 0,
        },
        "logging": {"every_steps": 1, "progress": "none"},
        "checkpoint": {"resume": "none"},
    }
    return _merge(cfg, sections)


def kimi_config(out: Path, **sections: Mapping[str, Any]) -> dict[str, Any]:
    """:func:`vl_config` with the tiny Kimi-K2.5 (MLA + MoE text model, MoonViT tower)."""
    cfg = vl_config(out, **sections)
    cfg["model"] = {**cfg["model"], "adapter": "kimi_k25", "config": "tiny"}
    return cfg


def model_config(model: str, out: Path, **sections: Mapping[str, Any]) -> dict[str, Any]:
    """``text_config``, ``vl_config`` or ``kimi_config``."""
    build = {"text": text_config, "vl": vl_config, "kimi": kimi_config}[model]
    return build(out, **sections)


def write_toml(raw: Mapping[str, Any], path: Path) -> Path:
    """Validate ``raw`` (with the installed plugins' sections) and write it as a TOML file."""
    from hyper_core.config import dump_config, load_config_dict
    from hyper_core.plugins import get_plugin_host

    sections = get_plugin_host().registries.config_sections
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(dump_config(load_config_dict(dict(raw), sections=sections)))
    return path


def load_toml(path: Path, overrides: Sequence[str] = ()) -> Any:
    """A Config from a TOML file and dotted overrides (the installed plugins' sections)."""
    from hyper_core.config import load_config
    from hyper_core.plugins import get_plugin_host

    return load_config(path, list(overrides), get_plugin_host().registries.config_sections)


#: Subprocesses (rank processes, the CLI) import this folder's plugins and helpers.
subprocess_env = functools.partial(processes.subprocess_env, (HERE, REPO))
hyper_train = functools.partial(processes.hyper_train, importable=(HERE, REPO), timeout=120)
torchrun = functools.partial(processes.torchrun, importable=(HERE, REPO), timeout=180)


#: ``dist_worker.py`` prints this line (rank 0, stderr) before each job.
JOB_MARK = re.compile(r"^dist_worker: job (\S+)$", re.M)


@attrs.frozen
class TwoRankRuns:
    """The shared launch's results (``conftest.two_rank_runs``): each module's jobs'
    output_dirs under ``root/<module name>``, and rank 0's stderr of each job."""

    root: Path
    logs: Mapping[str, str]

    def dir(self, module: str) -> Path:
        """The folder of ``module``'s jobs (the ``root`` its ``two_rank_jobs`` got)."""
        return self.root / module

    def log(self, out: Path) -> str:
        """Rank 0's stderr while it ran the job whose output_dir is ``out``."""
        return self.logs[str(out)]


def split_job_logs(stderr: str) -> dict[str, str]:
    """``output_dir -> stderr`` between its job's mark and the next."""
    marks = list(JOB_MARK.finditer(stderr))
    ends = [m.start() for m in marks[1:]] + [len(stderr)]
    return {m.group(1): stderr[m.end() : end] for m, end in zip(marks, ends, strict=True)}


def launch_two_rank_jobs(modules: Sequence[ModuleType], root: Path) -> TwoRankRuns:
    """The ``two_rank_jobs(root / module name)`` of every module in one ``dist_worker.py``
    launch on 2 ranks, within the sum of their ``TWO_RANK_TIMEOUT_S`` (300 s unless set)."""
    jobs: list[dict[str, Any]] = []
    for module in modules:
        jobs += module.two_rank_jobs(root / module.__name__)
    for job in jobs:  # a hang fails within a minute or two instead of the default 10
        job["config"].setdefault("parallel", {}).setdefault("timeout_s", 60)
    timeout = sum(getattr(module, "TWO_RANK_TIMEOUT_S", 300) for module in modules)
    jobs_file = root / "jobs.json"
    jobs_file.write_text(json.dumps(jobs))
    proc = torchrun(HERE / "dist_worker.py", [str(jobs_file)], nproc=2, timeout=timeout)
    logs = split_job_logs(proc.stderr)
    failed = f"the job of {list(logs)[-1]} failed:\n" if logs else ""
    assert proc.returncode == 0, failed + proc.stderr[-6000:]
    assert sorted(logs) == sorted(job["config"]["run"]["output_dir"] for job in jobs)
    return TwoRankRuns(root, logs)


def losses(out: Path, first_line: int = 0) -> dict[int, float]:
    """``step -> loss`` from ``metrics.jsonl`` (a resumed run's records override older ones),
    from its line ``first_line`` on (0-based)."""
    found: dict[int, float] = {}
    path = out / "metrics.jsonl"
    for line in path.read_text().splitlines()[first_line:]:
        record = json.loads(line)
        if "loss" in record:
            found[int(record["step"])] = float(record["loss"])
    return found


def grad_norms(out: Path) -> dict[int, float]:
    """``step -> grad_norm`` from ``metrics.jsonl``."""
    found: dict[int, float] = {}
    for line in (out / "metrics.jsonl").read_text().splitlines():
        record = json.loads(line)
        if "grad_norm" in record:
            found[int(record["step"])] = float(record["grad_norm"])
    return found


def assert_close(a: Mapping[int, float], b: Mapping[int, float], tol: float) -> None:
    """Same steps, values within ``tol`` (absolute)."""
    assert sorted(a) == sorted(b), (sorted(a), sorted(b))
    worst = max(abs(a[k] - b[k]) for k in a)
    assert worst <= tol, f"max |diff| {worst:.3g} > {tol:g}: {dict(a)} vs {dict(b)}"


def train_here(raw: Mapping[str, Any] | Any, plugins: Sequence[Any] = ()) -> Any:
    """Train in this process (one rank) with the installed plugins; a ``TinyRun``."""
    from hyper_core.plugins import get_plugin_host
    from hyper_core.testing import isolated_host, run_tiny_training

    host = isolated_host(plugins, entry_points=True) if plugins else get_plugin_host()
    return run_tiny_training(raw, host=host)


def probe_logits(model: Any) -> Any:
    """Logits of ``model`` on the worker's fixed probe input (eval mode, no grad)."""
    import torch
    from dist_worker import PROBE_IDS

    model.eval()
    with torch.no_grad():
        ids = torch.tensor([PROBE_IDS])
        return model(input_ids=ids, use_cache=False).logits.float()


@pytest.fixture
def one_thread() -> Any:
    """Run this test's in-process training on one intra-op thread, like the rank processes
    (bit-identical comparisons across processes need the same reduction order)."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
