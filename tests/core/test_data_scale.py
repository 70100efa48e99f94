"""A million-line training file costs the lazy reader little memory over a thousand lines,
in the main process and in a DataLoader worker (timings: ``python -m bench data``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.data import first_step, write_text_sft

pytestmark = pytest.mark.slow
MB = 2**20


def test_one_million_lines_cost_under_150_mb_over_one_thousand(tmp_path: Path) -> None:
    small = first_step(write_text_sft(tmp_path / "1k.jsonl", 1_000), tmp_path / "a", tmp_path / "c")
    big = first_step(
        write_text_sft(tmp_path / "1m.jsonl", 1_000_000), tmp_path / "b", tmp_path / "c"
    )
    main = (big["main_peak"] - small["main_peak"]) / MB
    worker = (big["worker_peak"] - small["worker_peak"]) / MB
    print(f"1M lines over 1k: main +{main:.1f} MB, worker +{worker:.1f} MB")
    assert big["worker_peak"] > 0  # a worker ran and was measured
    assert main <= 150 and worker <= 150


def test_the_eager_reader_is_what_the_bound_rules_out(tmp_path: Path) -> None:
    """The measurement can fail: the same lines read whole (``.json``) cost far more."""
    lines = 200_000
    lazy = first_step(write_text_sft(tmp_path / "a.jsonl", lines), tmp_path / "a", tmp_path / "c")
    eager = first_step(write_text_sft(tmp_path / "b.json", lines), tmp_path / "b", tmp_path / "c")
    assert (eager["main_peak"] - lazy["main_peak"]) / MB >= 150
