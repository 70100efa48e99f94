"""The benchmark runner's own logic, and one benchmark at CI size (no timing assertions)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.runner import (
    TABLE_BEGIN,
    TABLE_END,
    Figure,
    Ratio,
    Result,
    alternate,
    render_table,
    update_readme,
    write_result,
)


def make_result() -> Result:
    r = Result("demo", "a demo")
    r.figure("ours", "s").values.extend([1.0, 3.0, 2.0])
    r.figure("theirs", "s").values.extend([2.0, 4.0, 6.0])
    r.ratios["speedup"] = Ratio("theirs", "ours", ">= 1.6")
    r.ratios["overhead"] = Ratio("ours", "theirs", "<= 0.4")
    return r


def test_ratio_uses_medians_and_checks_goals() -> None:
    r = make_result()
    assert r.ratios["speedup"].value(r.figures) == pytest.approx(2.0)
    assert r.ratios["speedup"].met(2.0) is True
    assert r.ratios["overhead"].met(0.5) is False
    assert Ratio("a", "b").met(1.0) is None


def test_json_schema(tmp_path: Path) -> None:
    path = write_result(make_result(), tmp_path)
    doc = json.loads(path.read_text())
    assert set(doc) >= {"name", "machine", "figures", "ratios", "params", "time"}
    assert doc["figures"]["ours"] == {
        "unit": "s",
        "n": 3,
        "min": 1.0,
        "median": 2.0,
        "max": 3.0,
        "values": [1.0, 3.0, 2.0],
    }
    assert doc["ratios"]["speedup"]["value"] == pytest.approx(2.0)
    assert doc["ratios"]["speedup"]["met"] is True
    assert "python" in doc["machine"] and "torch" in doc["machine"]


def test_readme_table_is_replaced_between_markers(tmp_path: Path) -> None:
    write_result(make_result(), tmp_path)
    readme = tmp_path / "README.md"
    readme.write_text(f"# Bench\n\nintro\n\n{TABLE_BEGIN}\nold table\n{TABLE_END}\n\nfooter\n")
    update_readme(readme, tmp_path)
    text = readme.read_text()
    assert "old table" not in text and "intro" in text and "footer" in text
    assert "| demo | ours | 2 | 1 | 3 | s |" in text
    assert "| demo | **speedup** | **2** | | | ratio >= 1.6 ✓ |" in text
    assert "ratio <= 0.4 ✗" in text


def test_render_table_skips_empty_figures() -> None:
    r = Result("x", "y")
    r.figures["empty"] = Figure("s")
    assert "empty" not in render_table([r.to_json()])


def test_alternate_interleaves_sides() -> None:
    order: list[str] = []
    out = alternate(
        {"a": lambda: order.append("a") or 1.0, "b": lambda: order.append("b") or 2.0}, 3
    )
    assert order == ["a", "b", "a", "b", "a", "b"]
    assert out == {"a": [1.0] * 3, "b": [2.0] * 3}


def test_packing_benchmark_runs_at_ci_size() -> None:
    from bench import packing

    doc = packing.run(size="ci").to_json()
    figs = doc["figures"]
    assert figs["sft_packed_padding_fraction"]["median"] == 0.0
    assert figs["sft_padded_padding_fraction"]["median"] > 0.2  # long-tailed lengths
    assert doc["ratios"]["sft_packed_padding_vs_5pct"]["met"] is True
