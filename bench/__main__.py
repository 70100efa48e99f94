"""``python -m bench [NAME ...] [--size ci|full]``: run benchmarks, write results and the table."""

from __future__ import annotations

import argparse
import importlib
import sys

from .runner import update_readme, write_result

BENCHMARKS = (
    "startup",
    "hooks",
    "packing",
    "overhead",
    "dataloader",
    "checkpoint",
    "vs_hf_trainer",
    "encoder_parallel",
    "load",
    "loss",
    "data",
    "moe",
    "cp",
    "preference",
)


def main(argv: list[str] | None = None) -> int:
    """Run the named benchmarks (all by default)."""
    parser = argparse.ArgumentParser(prog="python -m bench")
    parser.add_argument("names", nargs="*", default=list(BENCHMARKS), choices=[*BENCHMARKS, []])
    parser.add_argument("--size", choices=["ci", "full"], default="full")
    parser.add_argument("--no-write", action="store_true", help="print only")
    args = parser.parse_args(argv)
    for name in args.names:
        module = importlib.import_module(f"bench.{name}")
        print(f"== {name} ({args.size})", file=sys.stderr, flush=True)
        result = module.run(size=args.size)
        if args.no_write:
            import json

            print(json.dumps(result.to_json(), indent=2))
        else:
            print(f"wrote {write_result(result)}", file=sys.stderr)
    if not args.no_write:
        update_readme()
    return 0


if __name__ == "__main__":
    sys.exit(main())
