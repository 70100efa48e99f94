"""Runs several training jobs in one ``torch.distributed.run`` launch (one import, one group).

    python -m torch.distributed.run --standalone --nproc-per-node 2 dist_worker.py JOBS.json

``JOBS.json`` is a list of ``{"config": RAW_CONFIG_DICT, "probe": bool, "inspect": str}``.
Before each job rank 0 prints ``dist_worker: job OUTPUT_DIR`` to stderr (the launch's log splits
there). Rank 0 writes each job's ``config.toml`` and ``worker.json`` (wall time, checkpoint
save/load seconds) into its output_dir; with ``probe`` the logits of the trained (sharded) model
on a fixed input to ``probe_logits.pt``; with ``inspect = "MODULE:FUNCTION"``, ``FUNCTION(trainer)``
is called after setup and returns a callable whose result (after training, a JSON-able dict)
goes to ``inspect.json``. Sharing the process across jobs keeps the test folder fast on 2 cores.
"""

from __future__ import annotations

import importlib
import json
import logging
import os
import sys
import time
import warnings
from pathlib import Path

PROBE_IDS = list(range(3, 35))


def main(jobs_file: str) -> None:
    import torch
    import torch.distributed as dist

    from hyper_core.config import dump_config, load_config_dict
    from hyper_core.plugins import get_plugin_host
    from hyper_core.trainer.trainer import Trainer

    rank = int(os.environ.get("RANK", "0"))
    if rank != 0:
        warnings.filterwarnings("ignore")
    logging.basicConfig(level=logging.INFO if rank == 0 else logging.ERROR)
    host = get_plugin_host()
    for job in json.loads(Path(jobs_file).read_text()):
        if rank == 0:
            print(f"dist_worker: job {job['config']['run']['output_dir']}", file=sys.stderr)
            sys.stderr.flush()
        config = load_config_dict(job["config"], sections=host.registries.config_sections)
        out = Path(config.run.output_dir)
        t0 = time.perf_counter()
        trainer = Trainer(config, host)
        trainer.setup()
        if rank == 0:
            out.mkdir(parents=True, exist_ok=True)
            (out / "config.toml").write_text(dump_config(config))
        seen = None
        if job.get("inspect"):
            module, function = job["inspect"].split(":")
            seen = getattr(importlib.import_module(module), function)(trainer)
        trainer.train()
        wall = time.perf_counter() - t0
        if seen is not None:
            result = seen()
            if rank == 0:
                (out / "inspect.json").write_text(json.dumps(result))
        if job.get("probe"):
            model = trainer.model
            model.eval()
            with torch.no_grad():
                ids = torch.tensor([PROBE_IDS], device=trainer.dist.device)
                logits = model(input_ids=ids, use_cache=False).logits.float().cpu()
            if rank == 0:
                torch.save(logits, out / "probe_logits.pt")
        if rank == 0:
            ck = trainer.checkpointer
            record = {"wall_s": wall, "save_s": ck.last_save_s, "load_s": ck.last_load_s}
            (out / "worker.json").write_text(json.dumps(record))
        del trainer
    if dist.is_initialized():
        dist.destroy_process_group()


if __name__ == "__main__":
    from hyper_core.parallel.exit import exit_rank

    main(sys.argv[1])
    exit_rank(0)  # no interpreter finalisation: see hyper_core.parallel.exit
