"""A million-line training file costs the lazy reader little memory over a thousand lines,
in the main process and in a DataLoader worker (timings: ``python -m bench data``).

The two runs each test compares are separate processes (each its own peak RSS) and run side by
side, each with its own index cache: the peaks do not depend on each other, and on 2 cores the
pair takes about the time of its slower run."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from bench.data import first_step, write_text_sft

pytestmark = pytest.mark.slow
MB = 2**20


def _pair(
    first: Callable[[], Path], second: Callable[[], Path], tmp_path: Path
) -> tuple[dict[str, Any], dict[str, Any]]:
    """``first_step`` on the files ``first()`` and ``second()`` write: the first run starts
    while the second file is being written."""

    def run(path: Path, name: str) -> dict[str, Any]:
        return first_step(path, tmp_path / name, tmp_path / f"{name}-cache")

    with ThreadPoolExecutor(2) as pool:
        a: Future[dict[str, Any]] = pool.submit(run, first(), "a")
        b = pool.submit(run, second(), "b")
        return a.result(), b.result()


def test_one_million_lines_cost_under_150_mb_over_one_thousand(tmp_path: Path) -> None:
    small, big = _pair(
        lambda: write_text_sft(tmp_path / "1k.jsonl", 1_000),
        lambda: write_text_sft(tmp_path / "1m.jsonl", 1_000_000),
        tmp_path,
    )
    main = (big["main_peak"] - small["main_peak"]) / MB
    worker = (big["worker_peak"] - small["worker_peak"]) / MB
    print(f"1M lines over 1k: main +{main:.1f} MB, worker +{worker:.1f} MB")
    assert big["worker_peak"] > 0  # a worker ran and was measured
    assert main <= 150 and worker <= 150


def test_the_eager_reader_is_what_the_bound_rules_out(tmp_path: Path) -> None:
    """The measurement can fail: the same lines read whole (``.json``) cost far more."""
    lines = 200_000
    lazy, eager = _pair(
        lambda: write_text_sft(tmp_path / "a.jsonl", lines),
        lambda: write_text_sft(tmp_path / "b.json", lines),
        tmp_path,
    )
    assert (eager["main_peak"] - lazy["main_peak"]) / MB >= 150
