"""``hyper-train memory estimate CONFIG`` and ``hyper-train memory report OUTPUT_DIR``."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .units import GIB, fmt_mib, parse_size

if TYPE_CHECKING:
    from hyper_core.cli.parser import CommandParser

#: ``memory estimate`` exit code when the estimate exceeds ``--device-memory`` after headroom.
EXIT_DOES_NOT_FIT = 3
#: Training samples read to measure the label share (``data stats``' counts).
LABEL_SAMPLES = 64
#: The default label share (the estimator's; repeated here to keep ``--help`` torch-free).
DEFAULT_LABEL_FRACTION = 0.38


def _fraction(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0.0 < value <= 1.0:
        raise argparse.ArgumentTypeError(f"expected a fraction in (0, 1], got {text!r}")
    return value


def _size(text: str) -> int:
    try:
        return parse_size(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def add_arguments(parser: CommandParser) -> None:
    """The ``memory`` command's actions and options (each action's parser, a
    :class:`~hyper_core.cli.parser.CommandParser` too, takes the global flags)."""
    sub = parser.add_subparsers(dest="memory_action", metavar="ACTION", required=True)
    est = sub.add_parser(
        "estimate",
        help="predict per-rank memory of a config (meta device, nothing allocated)",
        description=(
            "Build the config's model on the meta device and predict, per rank, parameters, "
            "gradients, AdamW state, buffers, activations of one micro-batch and transient "
            "buffers, under the configured sharding, dtypes and activation checkpointing. "
            "Extra --section.key=value arguments override the config. No weights are read: "
            "a [model] path directory with just the model's config.json is enough."
        ),
        epilog=(
            "exit codes: 0 the estimate (it fits --device-memory, if given); 2 a user error; "
            f"{EXIT_DOES_NOT_FIT} it does not fit --device-memory after --headroom."
        ),
    )
    est.accept_overrides()
    est.add_argument("config", help="the TOML config")
    est.add_argument(
        "--model-config",
        default=None,
        metavar="NAME",
        help="estimate the adapter's named config NAME (as [model] config) instead of "
        "[model] path: no files needed",
    )
    est.add_argument("--nproc-per-node", type=int, default=1, help="processes per node (1)")
    est.add_argument("--nnodes", type=int, default=1, help="nodes (1)")
    est.add_argument(
        "--device-memory",
        type=_size,
        default=None,
        metavar="SIZE",
        help="memory of one device, e.g. 80GiB or 141GB: says whether it fits, the total "
        "under each activation-checkpointing policy and the one with the least recompute "
        "that fits",
    )
    est.add_argument(
        "--headroom",
        type=float,
        default=0.10,
        help="fraction of --device-memory kept free for the CUDA context, "
        "allocator fragmentation and workspaces (0.10)",
    )
    est.add_argument(
        "--tokens",
        type=int,
        default=None,
        help="token positions per micro-batch (default: micro_batch_size × max_seq_len)",
    )
    est.add_argument(
        "--samples",
        type=int,
        default=None,
        help="samples per micro-batch (default: micro_batch_size)",
    )
    est.add_argument(
        "--patches",
        type=int,
        default=None,
        help="vision patches per micro-batch (default: one max_pixels image per sample)",
    )
    est.add_argument(
        "--label-fraction",
        type=_fraction,
        default=None,
        metavar="F",
        help="share of the tokens that carry a label (the LM head runs on those rows only); "
        f"default: measured on the first {LABEL_SAMPLES} training samples, else "
        f"{DEFAULT_LABEL_FRACTION:.2f} when the data or tokenizer can't be read",
    )
    est.add_argument("--rank", type=int, default=0, help="the rank to estimate (0: the largest)")
    est.add_argument("--json", action="store_true", help="machine-readable output")
    rep = sub.add_parser(
        "report",
        help="print the memory report of a profiled run",
        description="Print the tables of OUTPUT_DIR's memory summary (from [memory_profiler]).",
    )
    rep.add_argument("output_dir", help="the run's output_dir (or its memory folder)")
    rep.add_argument("--json", action="store_true", help="print summary.json")


def run(args: argparse.Namespace) -> int:
    """Dispatch ``memory ACTION``."""
    if args.memory_action == "report":
        return _report(args)
    return _estimate(args)


def _report(args: argparse.Namespace) -> int:
    from hyper_core.errors import UserError

    from .report import find_summary, format_report

    try:
        path = find_summary(args.output_dir)
    except FileNotFoundError as exc:
        raise UserError(str(exc)) from None
    summary = json.loads(path.read_text())
    if args.json:
        print(json.dumps(summary, indent=1))
    else:
        sys.stdout.write(format_report(summary))
    return 0


def _batch(args: argparse.Namespace, config: Any, registries: Any) -> Any:
    """The default (worst-case) micro-batch, with the command line's overrides."""
    if args.tokens is None and args.samples is None and args.patches is None:
        return None
    from hyper_core.resolve import resolve_adapter

    from .estimate import BatchShape, build_meta_model, default_batch, model_shape

    adapter = resolve_adapter(config.model, registries)
    model = build_meta_model(config, adapter)
    base = default_batch(config, adapter, model_shape(model, adapter), model)
    samples = args.samples if args.samples is not None else base.samples
    if args.tokens is not None:
        rows = 1 if base.rows == 1 else samples
        seq_len = max(args.tokens // rows, 1)
    else:
        rows, seq_len = base.rows, base.seq_len
    patches = args.patches if args.patches is not None else base.patches
    return BatchShape(
        rows=rows,
        seq_len=seq_len,
        samples=samples,
        patches=patches,
        images=base.images if patches else 0,
    )


def _estimate(args: argparse.Namespace) -> int:
    from hyper_core.cli.host import load_run_config
    from hyper_core.errors import UserError

    from .estimate import estimate_config

    world = args.nproc_per_node * args.nnodes
    if world < 1:
        raise UserError("memory estimate: --nproc-per-node and --nnodes must be >= 1")
    if not 0.0 <= args.headroom < 1.0:
        raise UserError("memory estimate: --headroom must be in [0, 1)")
    config, host = load_run_config(args)
    config = _model_to_estimate(config, args.model_config)
    if args.label_fraction is not None:
        fraction, source = args.label_fraction, "--label-fraction"
    else:
        fraction, source = label_fraction_of_data(config, host)
    batch = _batch(args, config, host.registries)

    def estimate(cfg: Any) -> Any:
        return estimate_config(
            cfg, host.registries, world, batch, args.rank, fraction, label_source=source
        )

    est = estimate(config)
    data = est.to_json()
    data["config"] = str(args.config)
    fits = None
    if args.device_memory is not None:
        usable = int(args.device_memory * (1.0 - args.headroom))
        fits = est.rows["total"] <= usable
        data["device_memory"] = args.device_memory
        data["usable_memory"] = usable
        data["fits"] = fits
        data["checkpointing_policies"] = policy_totals(config, estimate)
        data["recommended_checkpointing"] = next(
            (p for p, total in data["checkpointing_policies"].items() if total <= usable), None
        )
        if not fits:
            data["hint"] = fit_hints(config, world)
    if args.json:
        print(json.dumps(data, indent=1))
    else:
        sys.stdout.write(format_estimate(data))
    return EXIT_DOES_NOT_FIT if fits is False else 0


def fit_hints(config: Any, world_size: int) -> list[str]:
    """What to change in ``config`` to need less memory, the largest saving first."""
    hints: list[str] = []
    peft = config.section("peft")
    lora = peft is not None and peft.enabled
    if lora and (peft.base_dtype or config.model.dtype) == "float32":
        hints.append('[peft] base_dtype = "bfloat16" (the frozen base in bf16)')
    if not lora and config.section("peft") is not None:
        hints.append('[peft] method = "lora" (only adapters train)')
    if not config.training.activation_checkpointing:
        hints.append("[training] activation_checkpointing = true")
    if config.training.micro_batch_size > 1:
        hints.append("a smaller [training] micro_batch_size")
    hints.append("a smaller [data] max_seq_len")
    if config.parallel.strategy != "fsdp2" or world_size == 1:
        hints.append('more GPUs with [parallel] strategy = "fsdp2" (--nproc-per-node)')
    return hints


#: The longest reason the estimate gives for not reading the data.
REASON_CHARS = 100


def label_fraction_of_data(config: Any, host: Any) -> tuple[float, str]:
    """The share of label tokens in the first :data:`LABEL_SAMPLES` training samples (read
    through the run's transform, as ``data stats`` does) and where it came from; the default
    share, with the reason, when the tokenizer or the data can't be read."""
    from hyper_core.errors import UserError
    from hyper_core.trainer.data_stats import data_stats

    try:
        stats = data_stats(config, host, limit=LABEL_SAMPLES)
    except (UserError, OSError, ValueError, ImportError) as exc:
        import textwrap

        reason = (str(exc).splitlines() or [type(exc).__name__])[0]
        reason = textwrap.shorten(reason, REASON_CHARS, placeholder=" ...")  # at a word's end
        return DEFAULT_LABEL_FRACTION, f"default; the data was not read: {reason}"
    tokens = sum(c.tokens for c in stats.samples)
    if not tokens:
        return DEFAULT_LABEL_FRACTION, "default; no usable training sample"
    labels = sum(c.loss_tokens for c in stats.samples)
    return labels / tokens, f"measured on {len(stats.samples)} training samples"


def _model_to_estimate(config: Any, named: str | None) -> Any:
    """``config`` with ``[model] config = named`` instead of its path; else check that the
    path has the one file the estimate reads, ``config.json``."""
    import attrs

    from hyper_core.errors import UserError

    model = config.model
    if named is not None:
        if model.adapter is None:
            raise UserError("--model-config: [model] adapter is not set (add --model.adapter=NAME)")
        return attrs.evolve(config, model=attrs.evolve(model, path=None, config=named))
    if model.path is not None and not (Path(model.path) / "config.json").is_file():
        raise UserError(
            f"$.model.path: {model.path} has no config.json; the estimate reads no weights, so "
            "a directory with just the model's config.json is enough (--model.path=DIR), or "
            "estimate a named config of the adapter with --model-config NAME"
        )
    return config


def policy_totals(config: Any, estimate: Callable[[Any], Any]) -> dict[str, int]:
    """Per-rank totals of ``config`` under each activation-checkpointing policy (for both
    towers), cheapest (least recompute) first."""
    import attrs

    from hyper_core.parallel.checkpointing import POLICIES

    totals = {}
    for policy in POLICIES:
        training = attrs.evolve(
            config.training,
            activation_checkpointing=policy,
            vision_activation_checkpointing=None,
        )
        totals[policy] = estimate(attrs.evolve(config, training=training)).rows["total"]
    return totals


def _policy_text(data: dict[str, Any]) -> str:
    decoder = data["activation_checkpointing"]
    vision = data.get("vision_activation_checkpointing", decoder)
    return decoder if vision == decoder else f"{decoder} (vision tower {vision})"


def _policy_advice(data: dict[str, Any]) -> list[str]:
    configured = data["activation_checkpointing"]
    vision = data.get("vision_activation_checkpointing", configured)
    best = data.get("recommended_checkpointing")
    totals = ", ".join(f"{p} {t / GIB:.2f}" for p, t in data["checkpointing_policies"].items())
    lines = [f"per-rank total by activation-checkpointing policy (GiB): {totals}"]
    if best is None:
        lines.append("no activation-checkpointing policy fits; shard more or cut the batch")
    elif best != configured or vision != configured:
        verdict = "does not fit" if not data["fits"] else "is not the cheapest that fits"
        lines.append(
            f"recommended: activation_checkpointing = {best!r} (the least recompute that "
            f"fits); the configured {configured!r} {verdict}"
        )
    return lines


def format_estimate(data: dict[str, Any]) -> str:
    """The human-readable estimate table."""
    from .report import LABELS, loss_lines

    lay, prec, batch = data["layout"], data["precision"], data["batch"]
    shards = lay["dp_shard"] if lay["shards_parameters"] and lay["world_size"] > 1 else 1
    mode = "bf16 autocast" if prec["autocast"] else f"{prec['compute_bytes'] * 8}-bit"
    lines = [
        f"memory estimate for {data.get('config')}: {lay['world_size']} rank(s), strategy "
        f"{lay['strategy']}"
        + (f" (parameters sharded over {shards})" if shards > 1 else " (parameters replicated)")
        + f", {mode}, activation checkpointing "
        + _policy_text(data),
        f"micro-batch: {batch['rows']} row(s) × {batch['seq_len']} tokens = {batch['tokens']} "
        f"tokens, {batch['samples']} sample(s)"
        + (f", {batch['patches']} vision patches" if batch["patches"] else "")
        + (", attention mask" if batch["masked"] else ""),
        *loss_lines(data["loss_path"], batch["tokens"]),
    ]
    params = data.get("parameters") or {}
    if params.get("total"):
        lines.append(
            f"parameters: {params['total']:,}, trainable {params['trainable']:,} "
            f"({100 * params['trainable_share']:.2f}%)"
        )
    lines += ["", f"{'per rank':<48}{'MiB':>14}{'GiB':>10}"]
    for key, value in data["per_rank"].items():
        if key == "total":
            lines.append("-" * 72)
        lines.append(f"{LABELS.get(key, key):<48}{fmt_mib(value, 14)}{value / GIB:>10.2f}")
    state = data["state"]
    groups: list[str] = []
    for cat in ("params", "grads", "optimizer"):
        groups += [g for g in state[cat]["by_group"] if g not in groups]
    if len(groups) > 1:
        lines += ["", f"{'by group':<16}{'params':>14}{'grads':>14}{'optimizer':>14}"]
        for g in groups:
            lines.append(
                f"{g:<16}"
                + "".join(
                    fmt_mib(state[c]["by_group"].get(g, 0), 14)
                    for c in ("params", "grads", "optimizer")
                )
            )
    acts = {k: v for k, v in data["activations"].items() if k != "total" and v}
    lines += [
        "",
        "activations by part (MiB): " + ", ".join(f"{k} {fmt_mib(v)}" for k, v in acts.items()),
    ]
    trans = {k: v for k, v in data["transient"].items() if v}
    if trans:
        lines.append(
            "transient by part (MiB): " + ", ".join(f"{k} {fmt_mib(v)}" for k, v in trans.items())
        )
    if "fits" in data:
        total, usable = data["per_rank"]["total"], data["usable_memory"]
        verdict = "fits" if data["fits"] else "does NOT fit"
        lines += [
            "",
            f"device memory {data['device_memory'] / GIB:.1f} GiB, usable {usable / GIB:.1f} GiB "
            f"after headroom: {verdict} ({total / GIB:.2f} GiB = {100 * total / usable:.0f}% of "
            "usable)",
            *_policy_advice(data),
        ]
        if data.get("hint"):
            lines.append("to need less, change: " + "; ".join(data["hint"]))
    return "\n".join([*lines, ""])
