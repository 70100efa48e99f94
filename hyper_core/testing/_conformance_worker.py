"""Rank process of the conformance suite's 2-rank check (launched by ``torch.distributed.run``).

    python -m torch.distributed.run --standalone --nproc-per-node 2 \
        -m hyper_core.testing._conformance_worker JOB.json

``JOB.json`` holds ``{"config": RAW_CONFIG, "plugins": [MODULE, ...]}``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def main(job_file: str) -> None:
    import torch.distributed as dist

    from . import isolated_host, run_tiny_training

    job = json.loads(Path(job_file).read_text())
    plugins = job["plugins"]  # none given: every installed plugin, as in the calling process
    run_tiny_training(job["config"], host=isolated_host(plugins, entry_points=not plugins))
    if dist.is_initialized():
        dist.destroy_process_group()


if __name__ == "__main__":
    from hyper_core.parallel.exit import exit_rank

    main(sys.argv[1])
    exit_rank(0)  # no interpreter finalisation: see hyper_core.parallel.exit
