"""Where a training step's time goes: ``torch.profiler`` over steps of the ``overhead``
benchmark's ~27M Qwen2.5-VL-shaped model (the demo config, packed, ``varlen``), an op table
sorted by self CPU time.

    python -m bench.profile_step [--steps 3] [--rows 25]
"""

from __future__ import annotations

import argparse
import tempfile


def main(argv: list[str] | None = None) -> int:
    """Profile ``--steps`` training steps after two warm-up steps; print the op table."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    from .overhead import build_trainer

    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--rows", type=int, default=25)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        trainer = build_trainer("medium", tmp, steps=10_000)
        data = iter(trainer.dataloaders.train)
        batches = [next(data) for _ in range(args.steps + 2)]
        for batch in batches[:2]:
            trainer.train_step(batch)
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            for batch in batches[2:]:
                trainer.train_step(batch)
        trainer._teardown()
    table = prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=args.rows)
    print(f"torch {torch.__version__}, {args.steps} steps")
    print(table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
