"""``hyper-train predict MODEL --data FILE --out preds.jsonl``: batched generation over a test
file, one JSON line per sample in input order, and exact match, token F1 and ROUGE-L
(:mod:`hyper_core.predict`). ``--nproc-per-node N`` runs N ranks, each on its share."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from ..errors import UserError
from .parser import CommandParser


def add_predict(parser: CommandParser) -> None:
    """``predict MODEL --data FILE --out FILE``'s options."""
    parser.add_argument(
        "model",
        help="a checkpoints/step-N folder, checkpoints/latest, a run's output_dir or an export",
    )
    parser.add_argument("--data", required=True, help="the test file (.jsonl, .json or .parquet)")
    parser.add_argument("--out", required=True, help="where to write the predictions (JSON lines)")
    parser.add_argument(
        "--batch-size", type=int, default=8, help="prompts per generate (default 8)"
    )
    parser.add_argument("--max-new-tokens", type=int, default=128, help="longest answer (tokens)")
    parser.add_argument("--temperature", type=float, default=0.0, help="0: greedy (default)")
    parser.add_argument("--image-dir", default=None, help="relative image paths resolve here")
    parser.add_argument("--config", default=None, help="the run's config (for a checkpoint)")
    parser.add_argument("--adapter", default=None, help="the model adapter (for an export)")
    parser.add_argument("--device", default=None, help="default: cuda when available, else cpu")
    parser.add_argument(
        "--nproc-per-node", type=int, default=None, help="ranks on this machine, each on a share"
    )


def _check_args(args: argparse.Namespace) -> None:
    for name in ("batch_size", "max_new_tokens"):
        if getattr(args, name) < 1:
            flag = "--" + name.replace("_", "-")
            raise UserError(f"{flag}: expected at least 1, got {getattr(args, name)}")
    if args.temperature < 0:
        raise UserError(f"--temperature: expected at least 0, got {args.temperature}")
    if args.nproc_per_node is not None and args.nproc_per_node < 1:
        raise UserError(f"--nproc-per-node: expected at least 1, got {args.nproc_per_node}")
    if not Path(args.model).exists():
        raise UserError(f"{args.model}: no such checkpoint, run folder or exported model")
    if not Path(args.data).is_file() and not Path(args.data).is_dir():
        raise UserError(f"--data {args.data}: no such file")


def _rank_command(args: argparse.Namespace) -> list[str]:
    """This command again, under ``torch.distributed.run`` with ``--nproc-per-node`` ranks."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    cmd += [f"--nproc-per-node={args.nproc_per_node}", "-m", "hyper_core", "predict", args.model]
    for flag in ("data", "out", "batch_size", "max_new_tokens", "temperature"):
        cmd.append(f"--{flag.replace('_', '-')}={getattr(args, flag)}")
    for flag in ("image_dir", "config", "adapter", "device"):
        if getattr(args, flag) is not None:
            cmd.append(f"--{flag.replace('_', '-')}={getattr(args, flag)}")
    for module in args.plugin:
        cmd += ["--plugin", module]
    for flag in ("debug", "strict_plugins"):
        if getattr(args, flag):
            cmd.append("--" + flag.replace("_", "-"))
    return cmd


def cmd_predict(args: argparse.Namespace) -> int:
    """Predict here, on this rank's share under torchrun, or launch ``--nproc-per-node``
    ranks."""
    _check_args(args)
    if args.nproc_per_node and args.nproc_per_node > 1 and "LOCAL_RANK" not in os.environ:
        env = dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"))
        code = subprocess.run(_rank_command(args), env=env, check=False).returncode
        return 0 if code == 0 else 1
    return _predict_here(args)


def _progress(total: int, enabled: bool) -> tuple[Callable[[int], None], Callable[[], None]]:
    """``(advance, close)`` of a tqdm bar on a terminal, else of nothing."""
    if not enabled or total == 0 or not sys.stderr.isatty():
        return (lambda n: None), (lambda: None)
    from tqdm.auto import tqdm

    bar = tqdm(total=total, desc="predict", unit="sample", file=sys.stderr)
    return bar.update, bar.close


def _predict_here(args: argparse.Namespace) -> int:
    import torch

    from ..data.step_loader import rank_slice
    from ..generation import GenerationSettings
    from ..parallel.env import torchrun_env
    from ..predict import predict, prompt_sample, read_records, read_test_file, write_records
    from ..text_metrics import TextScores
    from ..trained_model import load_chat_model
    from .host import plugin_host

    env = torchrun_env()
    rank, world = (env["rank"], env["world_size"]) if env else (0, 1)
    device = args.device
    if device is None and env is not None and torch.cuda.is_available():
        device = f"cuda:{env['local_rank']}"
    host = plugin_host(args)
    rows = read_test_file(args.data, host.registries, args.image_dir)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    if world > 1:
        import torch.distributed as dist

        dist.init_process_group("gloo")
    try:
        chat = load_chat_model(
            args.model, host, config_path=args.config, adapter=args.adapter, device=device
        )
        lo, hi = rank_slice(len(rows), rank, world)
        samples = [prompt_sample(rows[i], i) for i in range(lo, hi)]
        settings = GenerationSettings(
            max_new_tokens=args.max_new_tokens, temperature=args.temperature
        )
        advance, close = _progress(len(samples), rank == 0)
        try:
            records = list(
                predict(chat, samples, settings, batch_size=args.batch_size, advance=advance)
            )
        finally:
            close()
        if world > 1:
            part = out.with_name(f"{out.name}.rank{rank}")
            write_records(part, records)
            dist.barrier()
            if rank == 0:
                records = []
                for r in range(world):
                    piece = out.with_name(f"{out.name}.rank{r}")
                    records += read_records(piece)
                    piece.unlink()
            dist.barrier()
    finally:
        if world > 1:
            dist.destroy_process_group()
    if rank != 0:
        return 0
    records.sort(key=lambda record: record["index"])
    write_records(out, records)
    scored = [
        (r["prediction"], r["reference"])
        for r in records
        if r.get("prediction") is not None and r["reference"] is not None
    ]
    errors = sum("error" in r for r in records)
    print(f"wrote {len(records)} predictions to {out}" + (f" ({errors} errors)" if errors else ""))
    print(TextScores.of(scored).line())
    return 0
