"""summary.json, report.md and memory.png (no torch import; matplotlib optional)."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from .units import MIB, fmt_mib

log = logging.getLogger("hyper_train.memory_profiler")

CATEGORIES = ("params", "grads", "optimizer", "buffers")
LABELS = {
    "params": "parameters",
    "grads": "gradients",
    "optimizer": "optimizer state",
    "buffers": "buffers",
    "activations": "activations (saved for backward)",
    "weight_copies": "autocast weight copies",
    "transient": "transient (logits, FSDP buffers, recompute)",
    "total": "total",
}
_PLOT_HINT = "pip install 'hyper-train-memory-profiler[plot]'"
_warned_no_matplotlib = False


# -- reading ------------------------------------------------------------------------------------


def find_summary(path: str | Path) -> Path:
    """The summary.json of a run: ``PATH/summary.json``, ``PATH/memory/summary.json``, or the
    ``[memory_profiler] output_dir`` named in ``PATH/config.toml``."""
    root = Path(path)
    candidates = (
        [root] if root.is_file() else [root / "summary.json", root / "memory" / "summary.json"]
    )
    config = root / "config.toml"
    if config.is_file():
        from hyper_core.config import read_toml

        section = read_toml(config).get("memory_profiler") or {}
        sub = section.get("output_dir")
        if isinstance(sub, str):
            p = Path(sub).expanduser()
            candidates.append((p if p.is_absolute() else root / p) / "summary.json")
    for candidate in candidates:
        if candidate.is_file():
            return candidate
    raise FileNotFoundError(
        f"{root}: no memory summary (looked for {', '.join(str(c) for c in candidates)}); "
        "was the run made with [memory_profiler] enabled = true?"
    )


# -- what the tables show -----------------------------------------------------------------------


def _row(stages: list[dict[str, Any]], suffix: str) -> dict[str, Any] | None:
    return next((s for s in stages if str(s.get("stage", "")).endswith(suffix)), None)


def measured_state(record: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Parameters, gradients, optimizer state and buffers of a rank at their fullest:
    after the first recorded step's backward (gradients) and optimizer step (the rest)."""
    stages = record.get("stages") or []
    if not stages:
        return {}
    after_opt = _row(stages, "after optimizer step") or stages[-1]
    after_bwd = _row(stages, "after backward") or after_opt
    return {
        "params": after_opt["params"],
        "grads": after_bwd["grads"],
        "optimizer": after_opt["optimizer"],
        "buffers": after_opt["buffers"],
    }


def first_measured_step(record: dict[str, Any]) -> dict[str, Any] | None:
    """The first recorded step with an activation measurement (else the first recorded)."""
    steps = record.get("steps") or []
    return next((s for s in steps if "activations" in s), steps[0] if steps else None)


def comparison(summary: dict[str, Any]) -> dict[str, dict[str, Any]] | None:
    """Estimate vs measured on rank 0, per row of the estimate."""
    est = summary.get("estimate")
    ranks = summary.get("ranks") or []
    if not est or not ranks:
        return None
    record = ranks[0]
    state = measured_state(record)
    step = first_measured_step(record) or {}
    measured: dict[str, Any] = {k: v["total"] for k, v in state.items()}
    measured["activations"] = step.get("activations")
    measured["weight_copies"] = step.get("param_copies")
    peak = step.get("peak")
    if peak is not None and "cuda" not in str(record.get("device")):
        # CPU: RSS includes the interpreter and libraries; compare what the run added to it.
        base = (record.get("stages") or [{}])[0].get("device", {}).get("rss")
        peak = peak - base if base is not None else None
    measured["total"] = peak
    out: dict[str, dict[str, Any]] = {}
    for key, value in est["per_rank"].items():
        got = measured.get(key)
        ratio = got / value if got is not None and value else None
        if key == "total" and "cuda" not in str(record.get("device")):
            ratio = None  # an RSS holds far more than tensors: no meaningful ratio
        out[key] = {"estimate": value, "measured": got, "ratio": ratio}
    return out


def loss_lines(loss: dict[str, Any], tokens: int) -> list[str]:
    """Where the estimate has the logits made (its ``loss_path``), and the label share behind
    it, for a micro-batch of ``tokens``."""
    if loss["mode"] == "every_position":
        where = (
            f"logits: at every position, {tokens:,} rows (the adapter or model does not "
            "compute them at label positions only)"
        )
    else:
        where = f"logits: at label positions only, {loss['rows']:,} of {tokens:,} rows"
    if loss["mode"] == "chunked":
        where += f", in chunks of {loss['chunk']:,} ([training] loss_chunk_tokens)"
    source = loss["label_source"]
    if source == "default":
        source = "the default"
    elif source.startswith("default; "):
        source = f"the default; {source.removeprefix('default; ')}; set --label-fraction"
    elif source == "--label-fraction":
        source = "from --label-fraction"
    elif source == "micro-batch":
        source = "counted in the micro-batch"
    return [where, f"labels: {100 * loss['label_fraction']:.1f}% of the tokens, {source}"]


# -- markdown -----------------------------------------------------------------------------------


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    align = ["---"] + ["---:"] * (len(header) - 1)
    return [
        "| " + " | ".join(header) + " |",
        "| " + " | ".join(align) + " |",
        *("| " + " | ".join(r) + " |" for r in rows),
    ]


def _device_cell(device: dict[str, int]) -> str:
    if "allocated" in device:
        return f"{fmt_mib(device['allocated'])} ({fmt_mib(device.get('reserved'))})"
    return fmt_mib(device.get("rss", device.get("peak_rss")))


def format_report(summary: dict[str, Any]) -> str:
    """The report as Markdown (what ``report.md`` holds and ``memory report`` prints)."""
    run = summary.get("run", {})
    ranks = summary.get("ranks") or []
    lines = ["# Memory report", ""]
    status = summary.get("status", "?")
    lines.append(
        f"Run `{run.get('output_dir')}`: adapter `{run.get('adapter')}`, device "
        f"{run.get('device')}, {run.get('world_size')} rank(s), strategy "
        f"`{run.get('strategy')}` (dp_shard {run.get('dp_shard')}), weights "
        f"{run.get('model_dtype')}, mixed precision {run.get('mixed_precision')}, activation "
        f"checkpointing {_policy(run.get('activation_checkpointing'))}; status "
        f"**{status}**."
    )
    if summary.get("error"):
        lines.append(f"The run failed: `{summary['error']}`; the figures go up to the failure.")
    lines += [
        "",
        f"Figures in MiB (2^20 bytes), rank-local (FSDP2 shards). Step peaks: "
        f"{summary.get('peak_method')}.",
        "",
    ]
    if not ranks:
        return "\n".join([*lines, "(no data)", ""])
    record = ranks[0]
    cuda = "cuda" in str(record.get("device"))
    device_col = "CUDA allocated (reserved)" if cuda else "process RSS"
    lines += ["## Per stage (rank 0)", ""]
    rows = []
    for s in record.get("stages", []):
        total = sum(s[c]["total"] for c in CATEGORIES)
        rows.append(
            [
                s["stage"],
                *(fmt_mib(s[c]["total"]) for c in CATEGORIES),
                fmt_mib(total),
                _device_cell(s.get("device", {})),
            ]
        )
    lines += _table(["stage", "params", "grads", "optimizer", "buffers", "total", device_col], rows)
    state = measured_state(record)
    if state:
        groups = list(record.get("groups") or [])
        for c in CATEGORIES:
            groups += [g for g in state[c]["by_group"] if g not in groups]
        used = [g for g in groups if any(state[c]["by_group"].get(g) for c in CATEGORIES)]
        lines += ["", "## By module group (rank 0, first recorded step)", ""]
        lines += _table(
            ["group", *CATEGORIES],
            [[g, *(fmt_mib(state[c]["by_group"].get(g, 0)) for c in CATEGORIES)] for g in used],
        )
        dtypes = sorted({d for c in CATEGORIES for d in state[c]["by_dtype"]})
        lines += ["", "## By dtype (rank 0, first recorded step)", ""]
        lines += _table(
            ["dtype", *CATEGORIES],
            [[d, *(fmt_mib(state[c]["by_dtype"].get(d, 0)) for c in CATEGORIES)] for d in dtypes],
        )
    steps = record.get("steps") or []
    if steps:
        lines += ["", "## Recorded steps (rank 0)", ""]
        rows = []
        for s in steps:
            batch = s.get("batch") or {}
            rows.append(
                [
                    str(s["step"]),
                    fmt_mib(s.get("peak")),
                    fmt_mib(s.get("delta")),
                    fmt_mib(s.get("activations")),
                    fmt_mib(s.get("param_copies")),
                    str(batch.get("rows", "-")) + " × " + str(batch.get("seq_len", "-")),
                    str(batch.get("patches", 0)),
                ]
            )
        lines += _table(
            ["step", "peak", "growth in step", "activations", "weight copies", "tokens", "patches"],
            rows,
        )
    if len(ranks) > 1:
        lines += ["", "## Ranks", ""]
        rows = []
        for r in ranks:
            st = measured_state(r)
            peaks = [p[1] for p in r.get("step_peaks", [])]
            rows.append(
                [
                    str(r["rank"]),
                    *(fmt_mib(st[c]["total"]) if st else "-" for c in CATEGORIES),
                    fmt_mib(max(peaks) if peaks else None),
                ]
            )
        lines += _table(["rank", *CATEGORIES, "max step peak"], rows)
    comp = summary.get("comparison")
    if comp:
        lines += ["", "## Estimate vs measured (rank 0)", ""]
        rows = []
        for key, v in comp.items():
            ratio = f"{v['ratio']:.3f}" if v.get("ratio") is not None else "-"
            label = LABELS.get(key, key)
            if key == "total":
                label = "total vs step peak" + ("" if cuda else " (RSS above setup_distributed's)")
            rows.append([label, fmt_mib(v["estimate"]), fmt_mib(v.get("measured")), ratio])
        lines += _table(["", "estimate", "measured", "measured / estimate"], rows)
        est = summary.get("estimate") or {}
        if est.get("loss_path"):  # summaries before formula version 2 have none
            lines += ["", *(f"- {x}" for x in loss_lines(est["loss_path"], est["batch"]["tokens"]))]
    errors = [e for r in ranks for e in r.get("errors", [])]
    if errors:
        lines += ["", "## Profiler errors", "", *(f"- {e}" for e in errors)]
    snapshots = [r["snapshot"] for r in ranks if r.get("snapshot")]
    if snapshots:
        lines += [
            "",
            "CUDA allocator snapshots (open in https://pytorch.org/memory_viz): "
            + ", ".join(f"`{Path(s).name}`" for s in snapshots),
        ]
    return "\n".join([*lines, ""])


# -- plot ---------------------------------------------------------------------------------------


def plot_summary(summary: dict[str, Any], path: Path) -> Path:
    """Per-stage stacked bars and the per-step peak line of rank 0 (raises ImportError
    without matplotlib)."""
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    record = (summary.get("ranks") or [{}])[0]
    stages = record.get("stages") or []
    peaks = record.get("step_peaks") or []
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(13, 5), gridspec_kw={"width_ratios": [3, 2]})
    names = [s["stage"] for s in stages]
    bottom = [0.0] * len(stages)
    for c in CATEGORIES:
        values = [s[c]["total"] / MIB for s in stages]
        ax1.bar(range(len(stages)), values, bottom=bottom, label=LABELS[c])
        bottom = [b + v for b, v in zip(bottom, values)]
    ax1.set_xticks(range(len(stages)), names, rotation=60, ha="right", fontsize=7)
    ax1.set_ylabel("MiB (rank 0)")
    ax1.set_title("Model state after each stage")
    ax1.legend(fontsize=8)
    if peaks:
        ax2.plot([p[0] for p in peaks], [p[1] / MIB for p in peaks], marker=".", label="peak")
        ax2.plot(
            [p[0] for p in peaks], [p[2] / MIB for p in peaks], marker=".", label="growth in step"
        )
        ax2.legend(fontsize=8)
    from matplotlib.ticker import MaxNLocator

    ax2.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax2.set_xlabel("step")
    ax2.set_ylabel("MiB")
    ax2.set_title(f"Step peak ({summary.get('peak_method', '')})", fontsize=9)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def write_outputs(
    summary: dict[str, Any],
    out_dir: Path,
    *,
    name: str = "summary.json",
    full: bool = True,
    plot: bool = True,
) -> dict[str, Path]:
    """Write ``summary.json`` (and with ``full`` ``report.md`` and ``memory.png``)."""
    global _warned_no_matplotlib
    out_dir.mkdir(parents=True, exist_ok=True)
    written: dict[str, Path] = {}
    summary["plot"] = None
    if full and plot:
        try:
            written["plot"] = plot_summary(summary, out_dir / "memory.png")
            summary["plot"] = "memory.png"
        except ImportError:
            if not _warned_no_matplotlib:
                log.warning(
                    "memory profiler: matplotlib is not installed, no memory.png (%s)", _PLOT_HINT
                )
                _warned_no_matplotlib = True
    path = out_dir / name
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(summary, indent=1))
    tmp.replace(path)
    written["summary"] = path
    if full:
        report = out_dir / "report.md"
        report.write_text(format_report(summary))
        written["report"] = report
    return written


def _policy(value: bool | str | None) -> str:
    """The run's activation-checkpointing policy (summaries before policies held a bool)."""
    return {True: "full", False: "none", None: "none"}.get(value, str(value))  # type: ignore[arg-type]
