"""The shared benchmark runner: figures over repeats, ratios, JSON results, the README table."""

from __future__ import annotations

import json
import os
import platform
import statistics
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import attrs

RESULTS = Path(__file__).parent / "results"
README = Path(__file__).parent / "README.md"
TABLE_BEGIN = "<!-- results:begin -->"
TABLE_END = "<!-- results:end -->"


@attrs.define
class Figure:
    """One measured quantity over repeats."""

    unit: str
    values: list[float] = attrs.field(factory=list)

    def summary(self) -> dict[str, Any]:
        """min/median/max and the raw values."""
        if not self.values:
            return {"unit": self.unit, "n": 0}
        return {
            "unit": self.unit,
            "n": len(self.values),
            "min": min(self.values),
            "median": statistics.median(self.values),
            "max": max(self.values),
            "values": self.values,
        }


@attrs.define
class Ratio:
    """``numerator / denominator`` of two figures' medians, with an optional goal."""

    numerator: str
    denominator: str
    goal: str | None = None  # e.g. "<= 1.03"

    def value(self, figures: dict[str, Figure]) -> float:
        """The ratio of the medians."""
        num = statistics.median(figures[self.numerator].values)
        den = statistics.median(figures[self.denominator].values)
        return num / den if den else float("inf")

    def met(self, value: float) -> bool | None:
        """Whether the goal holds (None without a goal)."""
        if self.goal is None:
            return None
        op, bound = self.goal.split()
        return {
            "<=": value <= float(bound),
            ">=": value >= float(bound),
            "<": value < float(bound),
            ">": value > float(bound),
        }[op]


@attrs.define
class Result:
    """What one benchmark produced."""

    name: str
    description: str
    figures: dict[str, Figure] = attrs.field(factory=dict)
    ratios: dict[str, Ratio] = attrs.field(factory=dict)
    params: dict[str, Any] = attrs.field(factory=dict)
    notes: list[str] = attrs.field(factory=list)

    def figure(self, name: str, unit: str) -> Figure:
        """The figure ``name`` (created on first use)."""
        return self.figures.setdefault(name, Figure(unit))

    def to_json(self) -> dict[str, Any]:
        """The JSON document written to ``bench/results/<name>.json``."""
        ratios = {}
        for key, ratio in self.ratios.items():
            value = ratio.value(self.figures)
            ratios[key] = {
                "value": value,
                "numerator": ratio.numerator,
                "denominator": ratio.denominator,
                "goal": ratio.goal,
                "met": ratio.met(value),
            }
        return {
            "name": self.name,
            "description": self.description,
            "machine": machine_info(),
            "params": self.params,
            "figures": {k: f.summary() for k, f in self.figures.items()},
            "ratios": ratios,
            "notes": self.notes,
            "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        }


def machine_info() -> dict[str, Any]:
    """Machine and package versions."""
    info: dict[str, Any] = {
        "platform": platform.platform(),
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
    }
    for pkg in ("torch", "transformers", "pluggy"):
        try:
            from importlib.metadata import version

            info[pkg] = version(pkg)
        except Exception:
            info[pkg] = None
    try:
        import torch

        if torch.cuda.is_available():
            info["gpu"] = torch.cuda.get_device_name(0)
    except ImportError:
        pass
    return info


def alternate(sides: dict[str, Callable[[], float]], repeats: int) -> dict[str, list[float]]:
    """Run each side ``repeats`` times, interleaved (A B A B ...), so machine noise cancels."""
    out: dict[str, list[float]] = {name: [] for name in sides}
    for _ in range(repeats):
        for name, fn in sides.items():
            out[name].append(fn())
    return out


def write_result(result: Result, directory: Path = RESULTS) -> Path:
    """Write ``<name>.json``."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{result.name}.json"
    path.write_text(json.dumps(result.to_json(), indent=2, sort_keys=True) + "\n")
    return path


def _fmt(value: float) -> str:
    if value == 0 or 0.01 <= abs(value) < 10_000:
        return f"{value:.3g}" if abs(value) < 100 else f"{value:.0f}"
    return f"{value:.3g}"


def render_table(documents: Iterable[dict[str, Any]]) -> str:
    """A markdown table: one row per figure and per ratio."""
    rows = [
        "| benchmark | figure | median | min | max | unit |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for doc in documents:
        for key, fig in doc["figures"].items():
            if not fig.get("n"):
                continue
            rows.append(
                f"| {doc['name']} | {key} | {_fmt(fig['median'])} | {_fmt(fig['min'])} | "
                f"{_fmt(fig['max'])} | {fig['unit']} |"
            )
        for key, ratio in doc["ratios"].items():
            goal = ratio["goal"] or ""
            met = {True: " ✓", False: " ✗", None: ""}[ratio["met"]]
            rows.append(
                f"| {doc['name']} | **{key}** | **{_fmt(ratio['value'])}** | | | "
                f"ratio {goal}{met} |"
            )
    return "\n".join(rows)


def update_readme(readme: Path = README, directory: Path = RESULTS) -> None:
    """Replace the table between the markers of ``bench/README.md`` with all results."""
    docs = [json.loads(p.read_text()) for p in sorted(directory.glob("*.json"))]
    table = render_table(docs)
    text = readme.read_text() if readme.is_file() else f"{TABLE_BEGIN}\n{TABLE_END}\n"
    if TABLE_BEGIN not in text:
        text += f"\n{TABLE_BEGIN}\n{TABLE_END}\n"
    head, rest = text.split(TABLE_BEGIN, 1)
    _, tail = rest.split(TABLE_END, 1)
    readme.write_text(f"{head}{TABLE_BEGIN}\n{table}\n{TABLE_END}{tail}")
