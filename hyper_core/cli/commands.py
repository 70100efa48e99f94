"""The core's subcommands (run, plugins, config, data, export, plot, new-plugin): each
``add_NAME(parser)`` and ``cmd_NAME(args)``, registered by :mod:`hyper_core.cli.plugin`."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from ..errors import RunFailed, UserError
from ..parallel.rank_output import connect_output
from ..parallel.rank_status import record_crashes, reported_by_launcher
from . import launch
from .data_show import add_show_options, cmd_data_show
from .host import load_checked_config, load_run_config, plugin_host
from .parser import CommandParser, add_world_options


def add_run(parser: CommandParser) -> None:
    """``run CONFIG``'s options."""
    parser.accept_overrides()
    parser.add_argument("config", help="the TOML config")
    parser.add_argument("--dry-run", action="store_true", help="validate and resolve, don't train")
    parser.add_argument(
        "--trace-hooks", action="store_true", help="log every hook call and its time"
    )
    add_world_options(parser)
    parser.add_argument("--node-rank", type=int, default=None, help="this node's rank")
    parser.add_argument("--rdzv-endpoint", default=None, help="HOST:PORT of the rendezvous")
    parser.add_argument("--rdzv-id", default=None, help="job id for the rendezvous")
    parser.add_argument(
        "--max-restarts",
        type=int,
        default=0,
        metavar="N",
        help="with --nproc-per-node: after a failed launch, start the ranks again up to N times, "
        "each resuming from the latest checkpoint (default: 0)",
    )


def add_plugins(parser: CommandParser) -> None:
    """``plugins [list|install|uninstall] [NAME]``'s options."""
    parser.add_argument(
        "action", nargs="?", choices=["list", "install", "uninstall"], default="list"
    )
    parser.add_argument("name", nargs="?", help="distribution to install or uninstall")
    parser.add_argument("--json", action="store_true", help="machine-readable output")


def add_config(parser: CommandParser) -> None:
    """``config show|validate CONFIG``'s options."""
    parser.accept_overrides()
    parser.add_argument("action", choices=["show", "validate"])
    parser.add_argument("config", help="the TOML config")
    add_world_options(parser)


def add_data(parser: CommandParser) -> None:
    """``data stats|show CONFIG``'s options."""
    parser.accept_overrides()
    parser.add_argument("action", choices=["stats", "show"])
    parser.add_argument("config", help="the TOML config")
    parser.add_argument("--samples", type=int, default=None, help="read only the first N samples")
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    add_show_options(parser)
    add_world_options(parser)


def add_export(parser: CommandParser) -> None:
    """``export CHECKPOINT --out DIR``'s options."""
    parser.add_argument(
        "checkpoint", help="a checkpoints/step-N folder, checkpoints/latest or a run's output_dir"
    )
    parser.add_argument("--out", required=True, help="output directory")
    parser.add_argument("--config", default=None, help="the run's config (default: its copy)")
    parser.add_argument(
        "--max-shard-size",
        default="5GB",
        help="largest safetensors shard, e.g. 2GB or 500MB (default: 5GB)",
    )
    parser.add_argument(
        "--dtype",
        choices=["auto", "bf16", "fp32", "fp16"],
        default="auto",
        help="dtype of the written weights; auto: the dtype in [model] path's config.json, "
        "else [model] dtype (default: auto)",
    )
    parser.add_argument(
        "--merge",
        action="store_true",
        help="for a checkpoint of adapters (e.g. a [peft] run): write the base model with the "
        "adapters merged in, instead of the adapters",
    )


def add_plot(parser: CommandParser) -> None:
    """``plot OUTPUT_DIR``'s options."""
    parser.add_argument("output_dir", help="the run's output_dir")
    parser.add_argument("--out", default=None, help="PNG path (default: OUTPUT_DIR/metrics.png)")


def add_new_plugin(parser: CommandParser) -> None:
    """``new-plugin NAME``'s options."""
    parser.add_argument("name", help="lowercase letters, digits and hyphens, e.g. my-adapter")
    parser.add_argument(
        "--kind",
        choices=["plugin", "adapter"],
        default="plugin",
        help="plugin: hook implementations and a config section; adapter: a model adapter "
        "(default: plugin)",
    )
    parser.add_argument(
        "--vision",
        action="store_true",
        help="with --kind adapter: a vision-language adapter (vision tower, projector and "
        "decoder; after the LLaVA example)",
    )
    parser.add_argument(
        "--tiles",
        action="store_true",
        help="with --vision: a tile-based adapter (each image a variable number of tiles; "
        "after InternVL)",
    )
    parser.add_argument("--out", default=".", metavar="DIR", help="parent folder (default: .)")


# -- run ------------------------------------------------------------------------------------


def _quiet_other_ranks(debug: bool) -> None:
    """Ranks other than 0 don't repeat rank 0's warnings (``--debug`` shows them all)."""
    if debug or int(os.environ.get("RANK", "0")) == 0:
        return
    import warnings

    warnings.filterwarnings("ignore")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")


def _trace_hooks(host: Any) -> None:
    import logging
    import time

    log = logging.getLogger("hyper_train.hooks")
    starts: list[float] = []

    def before(hook_name: str, impls: list[Any], kwargs: dict[str, Any]) -> None:
        starts.append(time.perf_counter())

    def after(outcome: Any, hook_name: str, impls: list[Any], kwargs: dict[str, Any]) -> None:
        elapsed = (time.perf_counter() - starts.pop()) * 1e3
        names = ", ".join(i.plugin_name for i in impls)
        log.info("hook %s [%s] %.3f ms", hook_name, names, elapsed)

    host.pm.add_hookcall_monitoring(before, after)


def cmd_run(args: argparse.Namespace) -> int:
    """``hyper-train run CONFIG``: train here, or launch ``--nproc-per-node`` ranks."""
    under_torchrun = "LOCAL_RANK" in os.environ
    restarts = getattr(args, "max_restarts", 0)
    if restarts < 0 or (restarts and not (args.nproc_per_node or 0) > 1):
        raise UserError(f"--max-restarts {restarts}: needs --nproc-per-node > 1 and N >= 0")
    if args.nproc_per_node and args.nproc_per_node > 1 and not under_torchrun and not args.dry_run:
        launch.torchrun_command(args)  # the launch options first
        # Fail fast, once, on a bad config or one for another world size.
        config, _ = load_checked_config(args)
        return launch.launch_torchrun(args, config.training.stall_timeout_s, restarts)
    if not under_torchrun:
        _run_here(args)  # stopped on a signal: the checkpoint is saved, exit 0 as well
        return 0
    _quiet_other_ranks(args.debug)
    connect_output()
    crash_report = record_crashes()  # noqa: F841 (open until the process ends)
    try:
        stopped = _run_here(args) == EXIT_STOPPED
    except (UserError, RunFailed) as exc:
        if not launch.write_status("failed", exc) or args.debug:
            raise
        return exc.exit_code  # the launcher prints it, once for all ranks
    except BaseException as exc:
        if launch.write_status("failed", exc) and reported_by_launcher(exc) and not args.debug:
            return 1  # a lost peer, a dead data worker: the launcher's report names it
        import logging

        world = os.environ.get("WORLD_SIZE", "?")
        logging.getLogger("hyper_train").error(
            "rank %s/%s failed: %s: %s", os.environ.get("RANK"), world, type(exc).__name__, exc
        )
        raise
    launch.write_status("stopped" if stopped else "ok")
    return 0


#: Internal: ``_run_here`` stopped early on a signal (the process still exits 0).
EXIT_STOPPED = -1


def _run_here(args: argparse.Namespace) -> int:
    from ..config.preflight import check_environment

    config, host = load_run_config(args)
    from ..resolve import named, resolve_adapter, resolve_strategy

    if args.dry_run:
        adapter = resolve_adapter(config.model, host.registries)
        resolve_strategy(config, host.registries)
        batching = config.data.batching or adapter.default_batching
        named("$.data.batching", host.registries.batching_runtimes, batching)
        from ..batching.token_budget import check_token_budget

        check_token_budget(batching, config.data.max_tokens_per_micro_batch)
        check_environment(config, source=str(args.config))  # after what the config names
        print(
            f"config ok: adapter {adapter.name}, batching {batching}, "
            f"strategy {config.parallel.strategy}"
        )
        return 0
    check_environment(config, source=str(args.config))
    if args.trace_hooks:
        _trace_hooks(host)
    from ..trainer.progress import library_bars
    from ..trainer.run import run_training

    with library_bars(config):
        trainer = run_training(config, host)
    return EXIT_STOPPED if trainer.state.stop_requested else 0


# -- plugins --------------------------------------------------------------------------------


def cmd_plugins(args: argparse.Namespace) -> int:
    """``hyper-train plugins [--json]``, ``plugins install|uninstall NAME``."""
    if args.action in ("install", "uninstall"):
        if not args.name:
            raise UserError(f"plugins {args.action}: name the distribution")
        pip = [sys.executable, "-m", "pip", args.action]
        if args.action == "uninstall":
            pip.append("-y")
        return subprocess.run([*pip, args.name], check=False).returncode
    host = plugin_host(args)
    records = list(host.records.values())
    if args.json:
        print(json.dumps([r.to_json() for r in records], indent=2))
        return 0
    for r in records:
        origin = f"{r.distribution} {r.version}" if r.distribution else r.module
        print(f"{r.name}  [{r.status}]  {origin}")
        if r.error:
            print(f"    error: {r.error}")
        for kind, names in sorted(r.registers.items()):
            print(f"    {kind}: {', '.join(names)}")
        if r.hooks:
            print(f"    hooks: {', '.join(r.hooks)}")
    return 0


# -- config ---------------------------------------------------------------------------------


def cmd_config(args: argparse.Namespace) -> int:
    """``hyper-train config show|validate CONFIG``."""
    from ..config import dump_config

    config, host = load_checked_config(args) if args.action == "validate" else load_run_config(args)
    if args.action == "show":
        sys.stdout.write(dump_config(_with_resolved_adapter(config, host)))
    else:
        print(f"{args.config}: ok")
    return 0


def _with_resolved_adapter(config: Any, host: Any) -> Any:
    """``[model] adapter`` filled in from the model directory's config.json, as a run would
    resolve it (left unset when the directory is not here to read)."""
    import attrs

    from ..resolve import resolve_adapter

    if config.model.adapter is not None:
        return config
    try:
        adapter = resolve_adapter(config.model, host.registries)
    except UserError:
        return config
    return attrs.evolve(config, model=attrs.evolve(config.model, adapter=adapter.name))


# -- data -----------------------------------------------------------------------------------


#: ``data stats`` read no usable sample.
EXIT_NO_USABLE_DATA = 3


def cmd_data(args: argparse.Namespace) -> int:
    """``hyper-train data stats CONFIG [--samples N] [--json]``, ``data show CONFIG``."""
    from ..config.world import NodeRange
    from ..trainer.data_stats import data_stats

    if args.samples is not None and args.samples < 1:
        raise UserError(f"--samples: expected at least 1, got {args.samples}")
    config, host = load_checked_config(args)
    if args.action == "show":
        return cmd_data_show(args, config, host)
    world = (args.nproc_per_node or 1) * NodeRange.parse(args.nnodes).min
    # The ranks of a context-parallel group read the same samples (checked to divide).
    dp = max(world // config.parallel.cp, 1)
    stats = data_stats(config, host, limit=args.samples, world_size=dp)
    print(json.dumps(stats.to_json(), indent=2) if args.json else stats.render())
    reason = stats.no_usable_reason()
    if reason is not None:
        print(f"hyper-train: error: {reason}", file=sys.stderr)
        return EXIT_NO_USABLE_DATA
    return 0


# -- export ---------------------------------------------------------------------------------


def cmd_export(args: argparse.Namespace) -> int:
    """``hyper-train export CHECKPOINT --out DIR [--max-shard-size 5GB] [--dtype auto]
    [--merge]``: a plugin's ``export_checkpoint`` hook, else the full model."""
    from ..checkpoint import resolve_checkpoint, run_config_for
    from ..config import load_config
    from ..export import ExportOptions, export_checkpoint
    from ..safetensors_writer import parse_shard_size

    try:
        max_shard_size = parse_shard_size(args.max_shard_size)
    except ValueError:
        raise UserError(
            f"--max-shard-size: {args.max_shard_size!r} is not a size (e.g. 5GB, 500MB, 10KB)"
        ) from None
    ckpt = resolve_checkpoint(args.checkpoint)
    config_path = Path(args.config) if args.config else run_config_for(ckpt)
    if config_path is None or not config_path.is_file():
        missing = config_path or ckpt.parent.parent / "config.toml"
        raise UserError(f"{missing}: no config found for {ckpt} (pass --config)")
    host = plugin_host(args)
    config = load_config(config_path, (), host.registries.config_sections)
    options = ExportOptions(max_shard_size=max_shard_size, dtype=args.dtype, merge=args.merge)
    out = host.call_stage(
        "export_checkpoint",
        config=config,
        registries=host.registries,
        checkpoint=ckpt,
        out_dir=Path(args.out),
        options=options,
    )
    if out is None:  # no plugin exports this run: the full model
        if args.merge:
            raise UserError(
                f"--merge: {ckpt} holds no adapters to merge (its run sets no [peft] or other "
                "adapter plugin); export it without --merge"
            )
        out = export_checkpoint(
            config, host, ckpt, Path(args.out), max_shard_size=max_shard_size, dtype=args.dtype
        )
    print(f"exported {ckpt} to {out}")
    return 0


# -- plot -----------------------------------------------------------------------------------


def cmd_plot(args: argparse.Namespace) -> int:
    """``hyper-train plot OUTPUT_DIR``."""
    from ..trainer.plot import plot_metrics

    out = plot_metrics(Path(args.output_dir), Path(args.out) if args.out else None)
    print(f"wrote {out}")
    return 0


# -- new-plugin -----------------------------------------------------------------------------


def cmd_new_plugin(args: argparse.Namespace) -> int:
    """``hyper-train new-plugin NAME --kind plugin|adapter [--vision [--tiles]] [--out DIR]``."""
    from ..scaffold import render, scaffold

    target = scaffold(args.name, args.kind, args.out, vision=args.vision, tiles=args.tiles)
    what = args.kind + (", vision" if args.vision else "") + (", tiles" if args.tiles else "")
    print(f"created {target}/ ({what}):")
    for rel in render(args.name, args.kind, vision=args.vision, tiles=args.tiles):
        print(f"  {rel}")
    print("next, in the environment hyper-train runs from:")
    print(f"  python -m pip install -e '{target}[test]'")
    print("  hyper-train plugins")
    print(f"  python -m pytest {target / 'tests'}")
    return 0
