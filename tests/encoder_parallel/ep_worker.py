"""Runs several training jobs in one ``torch.distributed.run`` launch.

    python -m torch.distributed.run --standalone --nproc-per-node 2 ep_worker.py JOBS.json

``JOBS.json`` maps a job name to ``{"config": RAW_CONFIG, "exclude": [entry points],
"plugins": [modules], "count_syncs": bool}``: the job runs with every installed plugin except
``exclude`` (through the ``HYPER_TRAIN_PLUGINS`` filter), plus the plugin modules ``plugins``,
the gradient probe :mod:`ep_probe` (and the host-sync counter :mod:`ep_syncs` with
``count_syncs``). Each rank writes ``ep_stats-rank<R>.json``
(the balancer's counters, or null without one) into the job's output_dir; rank 0 the resolved
``config.toml``.
"""

from __future__ import annotations

import importlib.metadata as md
import json
import logging
import os
import sys
import warnings
from pathlib import Path


def main(jobs_file: str) -> None:
    import torch.distributed as dist

    from hyper_core.config import dump_config, load_config_dict
    from hyper_core.plugins.manager import ENTRY_POINT_GROUP, FILTER_ENV, PluginHost
    from hyper_core.trainer.trainer import Trainer
    from hyper_encoder_parallel.run import EncoderParallelRun

    rank = int(os.environ.get("RANK", "0"))
    if rank != 0:
        warnings.filterwarnings("ignore")
    logging.basicConfig(level=logging.INFO if rank == 0 else logging.ERROR)
    names = sorted({ep.name for ep in md.entry_points(group=ENTRY_POINT_GROUP)})
    for job in json.loads(Path(jobs_file).read_text()).values():
        exclude = set(job.get("exclude", ()))
        if exclude:
            os.environ[FILTER_ENV] = ",".join(n for n in names if n not in exclude)
        extra = ["ep_probe", *job.get("plugins", ())]
        extra += ["ep_syncs"] if job.get("count_syncs") else []
        host = PluginHost(extra_modules=extra, strict=True)
        os.environ.pop(FILTER_ENV, None)
        config = load_config_dict(job["config"], sections=host.registries.config_sections)
        out = Path(config.run.output_dir)
        if rank == 0:
            out.mkdir(parents=True, exist_ok=True)
            (out / "config.toml").write_text(dump_config(config))
        trainer = Trainer(config, host)
        trainer.train()
        run = next((cb for cb in trainer.callbacks if isinstance(cb, EncoderParallelRun)), None)
        balancer = run.balancer if run is not None else None
        stats = balancer.stats.to_json() if balancer is not None else None
        (out / f"ep_stats-rank{rank}.json").write_text(json.dumps(stats))
        del trainer
    if dist.is_initialized():
        dist.destroy_process_group()


if __name__ == "__main__":
    from hyper_core.parallel.exit import exit_rank

    main(sys.argv[1])
    exit_rank(0)  # no interpreter finalisation: see hyper_core.parallel.exit
