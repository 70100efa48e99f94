"""The core's subcommands: run, plugins, config, data, export, chat, predict, plot, new-plugin."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..errors import PluginError, RunFailed, UserError
from ..parallel.rank_output import connect_output
from ..parallel.rank_status import record_crashes, reported_by_launcher
from . import launch
from .data_show import add_show_options, cmd_data_show
from .predict import add_predict_command

CORE_COMMANDS = (
    "run",
    "plugins",
    "config",
    "data",
    "export",
    "chat",
    "predict",
    "plot",
    "new-plugin",
)


def add_commands(sub: Any, global_options: Callable[[argparse.ArgumentParser], None]) -> None:
    """Add the core's subcommands to ``sub``."""
    run = sub.add_parser(
        "run",
        help="train from a config",
        description="Train from a TOML config. Extra --section.key=value arguments override it.",
    )
    global_options(run)
    run.add_argument("config", help="the TOML config")
    run.add_argument("--dry-run", action="store_true", help="validate and resolve, don't train")
    run.add_argument("--trace-hooks", action="store_true", help="log every hook call and its time")
    _world_options(run)
    run.add_argument("--node-rank", type=int, default=None, help="this node's rank")
    run.add_argument("--rdzv-endpoint", default=None, help="HOST:PORT of the rendezvous")
    run.add_argument("--rdzv-id", default=None, help="job id for the rendezvous")
    run.add_argument(
        "--max-restarts",
        type=int,
        default=0,
        metavar="N",
        help="with --nproc-per-node: after a failed launch, start the ranks again up to N times, "
        "each resuming from the latest checkpoint (default: 0)",
    )
    run.set_defaults(handler=cmd_run, accepts_overrides=True)

    plugins = sub.add_parser("plugins", help="list, install or uninstall plugins")
    global_options(plugins)
    plugins.add_argument(
        "action", nargs="?", choices=["list", "install", "uninstall"], default="list"
    )
    plugins.add_argument("name", nargs="?", help="distribution to install or uninstall")
    plugins.add_argument("--json", action="store_true", help="machine-readable output")
    plugins.set_defaults(handler=cmd_plugins)

    config = sub.add_parser("config", help="show or validate a config")
    global_options(config)
    config.add_argument("action", choices=["show", "validate"])
    config.add_argument("config", help="the TOML config")
    _world_options(config)
    config.set_defaults(handler=cmd_config, accepts_overrides=True)

    data = sub.add_parser(
        "data",
        help="check the training data without training",
        description="stats: read the training samples through the real transform (no model) "
        "and print bad samples, tokens and images per sample, predicted padding and steps "
        "(exit 3 when no sample is usable). show: one sample as the model sees it, its trained "
        "tokens marked, each image as its token count.",
    )
    global_options(data)
    data.add_argument("action", choices=["stats", "show"])
    data.add_argument("config", help="the TOML config")
    data.add_argument("--samples", type=int, default=None, help="read only the first N samples")
    data.add_argument("--json", action="store_true", help="machine-readable output")
    add_show_options(data)
    _world_options(data)
    data.set_defaults(handler=cmd_data, accepts_overrides=True)

    export = sub.add_parser("export", help="write a checkpoint in the Hugging Face layout")
    global_options(export)
    export.add_argument(
        "checkpoint", help="a checkpoints/step-N folder, checkpoints/latest or a run's output_dir"
    )
    export.add_argument("--out", required=True, help="output directory")
    export.add_argument("--config", default=None, help="the run's config (default: its copy)")
    export.add_argument(
        "--max-shard-size",
        default="5GB",
        help="largest safetensors shard, e.g. 2GB or 500MB (default: 5GB)",
    )
    export.add_argument(
        "--dtype",
        choices=["auto", "bf16", "fp32", "fp16"],
        default="auto",
        help="dtype of the written weights; auto: the dtype in [model] path's config.json, "
        "else [model] dtype (default: auto)",
    )
    export.add_argument(
        "--merge",
        action="store_true",
        help="for a checkpoint of adapters (e.g. a [peft] run): write the base model with the "
        "adapters merged in, instead of the adapters",
    )
    export.set_defaults(handler=cmd_export)

    chat = sub.add_parser(
        "chat",
        help="answer prompts with a trained model",
        description="Load a checkpoint, a run's output_dir or an exported model and answer: "
        "once with --prompt, else one line of stdin at a time (/image PATH attaches an image "
        "to the next message, /clear forgets the conversation, exit or EOF ends).",
    )
    global_options(chat)
    chat.add_argument(
        "model",
        help="a checkpoints/step-N folder, checkpoints/latest, a run's output_dir or an export "
        "(a LoRA adapter directory too)",
    )
    chat.add_argument("--prompt", default=None, help="answer this one message and exit")
    chat.add_argument(
        "--image", action="append", default=[], metavar="PATH", help="attach an image (repeatable)"
    )
    chat.add_argument("--system", default=None, help="a system message")
    chat.add_argument("--max-new-tokens", type=int, default=128, help="longest answer (tokens)")
    chat.add_argument("--temperature", type=float, default=0.0, help="0: greedy (default)")
    chat.add_argument("--config", default=None, help="the run's config (for a checkpoint)")
    chat.add_argument("--adapter", default=None, help="the model adapter (for an export)")
    chat.add_argument("--device", default=None, help="default: cuda when available, else cpu")
    chat.set_defaults(handler=cmd_chat)

    add_predict_command(sub, global_options)

    plot = sub.add_parser("plot", help="draw loss, lr and throughput of a run to a PNG")
    global_options(plot)
    plot.add_argument("output_dir", help="the run's output_dir")
    plot.add_argument("--out", default=None, help="PNG path (default: OUTPUT_DIR/metrics.png)")
    plot.set_defaults(handler=cmd_plot)

    new = sub.add_parser(
        "new-plugin",
        help="scaffold a plugin or model-adapter package",
        description="Write DIR/hyper-train-NAME/: pyproject.toml with the hyper_train.plugins "
        "entry point, the hyper_NAME package, a README and tests using hyper-train's test kit.",
    )
    global_options(new)
    new.add_argument("name", help="lowercase letters, digits and hyphens, e.g. my-adapter")
    new.add_argument(
        "--kind",
        choices=["plugin", "adapter"],
        default="plugin",
        help="plugin: hook implementations and a config section; adapter: a model adapter "
        "(default: plugin)",
    )
    new.add_argument(
        "--vision",
        action="store_true",
        help="with --kind adapter: a vision-language adapter (vision tower, projector and "
        "decoder; after the LLaVA example)",
    )
    new.add_argument("--out", default=".", metavar="DIR", help="parent folder (default: .)")
    new.set_defaults(handler=cmd_new_plugin)


# -- helpers --------------------------------------------------------------------------------


def _world_options(parser: argparse.ArgumentParser) -> None:
    """``--nproc-per-node``/``--nnodes``: the world size the config is checked against."""
    parser.add_argument("--nproc-per-node", type=int, default=None, help="processes per node")
    parser.add_argument(
        "--nnodes",
        default=None,
        help="nodes, N or MIN:MAX (the config is checked for every world size in between)",
    )


def plugin_host(args: argparse.Namespace) -> Any:
    """The plugin host for this invocation (``--plugin`` modules, ``--strict-plugins``)."""
    from ..plugins import get_plugin_host

    return get_plugin_host(tuple(args.plugin), strict=True if args.strict_plugins else None)


def check_required_plugins(host: Any, required: list[str]) -> None:
    """``[run] plugins`` names installed plugins (entry point or distribution) the run needs.

    A config never names code to import: these must already be installed.
    """
    for name in required:
        record = host.records.get(name) or next(
            (r for r in host.records.values() if r.distribution == name), None
        )
        if record is None:
            raise PluginError(f"$.run.plugins: plugin {name!r} is not installed (pip install it)")
        if record.status == "disabled":
            raise PluginError(
                f"$.run.plugins: plugin {name!r} is installed but disabled by "
                f"HYPER_TRAIN_PLUGINS={os.environ.get('HYPER_TRAIN_PLUGINS', '')!r}"
            )
        if record.status == "failed":
            raise PluginError(f"$.run.plugins: plugin {name!r} failed to load: {record.error}")


def load_run_config(args: argparse.Namespace) -> tuple[Any, Any]:
    """Read and validate the config with the installed plugins, for the world size of
    ``--nproc-per-node``/``--nnodes`` when given; returns ``(config, host)``."""
    from ..config import load_config
    from ..config.adapter_options import check_adapter_options
    from ..config.world import check_world
    from ..resolve import strategy_class

    host = plugin_host(args)
    config = load_config(args.config, args.overrides, host.registries.config_sections)
    check_required_plugins(host, config.run.plugins)
    check_adapter_options(config, host.registries, source=str(args.config))
    nproc, nnodes = getattr(args, "nproc_per_node", None), getattr(args, "nnodes", None)
    strategy = strategy_class(config, host.registries)
    check_world(config, nproc, nnodes, source=str(args.config), strategy=strategy)
    return config, host


def load_checked_config(args: argparse.Namespace) -> tuple[Any, Any]:
    """:func:`load_run_config`, then the checks against this machine that a run needs (its
    data files exist, its loggers are installed); an estimate needs neither."""
    from ..config.preflight import check_environment

    config, host = load_run_config(args)
    check_environment(config, source=str(args.config))
    return config, host


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
    stats = data_stats(config, host, limit=args.samples, world_size=world)
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


# -- chat -----------------------------------------------------------------------------------


def cmd_chat(args: argparse.Namespace) -> int:
    """``hyper-train chat MODEL [--image PATH] [--prompt TEXT]``."""
    from ..inference import GenerationSettings, chat_lines, check_image, load_chat_model

    images = [check_image(p, "--image") for p in args.image]
    if args.max_new_tokens < 1:
        raise UserError(f"--max-new-tokens: expected at least 1, got {args.max_new_tokens}")
    if args.temperature < 0:
        raise UserError(f"--temperature: expected at least 0, got {args.temperature}")
    settings = GenerationSettings(max_new_tokens=args.max_new_tokens, temperature=args.temperature)
    chat = load_chat_model(
        args.model,
        plugin_host(args),
        config_path=args.config,
        adapter=args.adapter,
        device=args.device,
    )
    lines = [args.prompt] if args.prompt is not None else _stdin_lines()
    for answer in chat_lines(chat, lines, images=images, system=args.system, settings=settings):
        print(answer, flush=True)
    return 0


def _stdin_lines() -> Any:
    """Lines of stdin, with a ``> `` prompt on a terminal."""
    if sys.stdin.isatty():
        while True:
            try:
                yield input("> ")
            except EOFError:
                return
    else:
        for line in sys.stdin:
            yield line.rstrip("\n")


# -- plot -----------------------------------------------------------------------------------


def cmd_plot(args: argparse.Namespace) -> int:
    """``hyper-train plot OUTPUT_DIR``."""
    from ..trainer.plot import plot_metrics

    out = plot_metrics(Path(args.output_dir), Path(args.out) if args.out else None)
    print(f"wrote {out}")
    return 0


# -- new-plugin -----------------------------------------------------------------------------


def cmd_new_plugin(args: argparse.Namespace) -> int:
    """``hyper-train new-plugin NAME --kind plugin|adapter [--vision] [--out DIR]``."""
    from ..scaffold import render, scaffold

    target = scaffold(args.name, args.kind, args.out, vision=args.vision)
    print(f"created {target}/ ({args.kind}{', vision' if args.vision else ''}):")
    for rel in render(args.name, args.kind, vision=args.vision):
        print(f"  {rel}")
    print("next, in the environment hyper-train runs from:")
    print(f"  python -m pip install -e '{target}[test]'")
    print("  hyper-train plugins")
    print(f"  python -m pytest {target / 'tests'}")
    return 0
