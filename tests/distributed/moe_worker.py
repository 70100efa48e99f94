"""Runs the expert-parallel jobs of ``test_expert_parallel.py`` in one torchrun launch.

    python -m torch.distributed.run --standalone --nproc-per-node N moe_worker.py JOBS.json

``JOBS.json`` is a list of ``{"config": RAW_CONFIG, "skew": bool}``. With ``skew`` the run
routes every token to experts 0 and 1 (:mod:`moe_routing`). Rank 0 writes, into each job's
output_dir, ``shapes.json``: every rank's local and global shape of each expert weight, and
``probe_logits.pt``: the trained model's logits on fixed ids.
"""

from __future__ import annotations

import json
import os
import sys
import warnings
from pathlib import Path

PROBE_IDS = list(range(3, 35))


def main(jobs_file: str) -> None:
    import torch
    import torch.distributed as dist
    from moe_routing import SkewedRouting

    from hyper_core.config import load_config_dict
    from hyper_core.plugins import get_plugin_host
    from hyper_core.trainer.trainer import Trainer

    if int(os.environ.get("RANK", "0")) != 0:
        warnings.filterwarnings("ignore")
    host = get_plugin_host()
    for job in json.loads(Path(jobs_file).read_text()):
        config = load_config_dict(job["config"], sections=host.registries.config_sections)
        skew = SkewedRouting() if job.get("skew") else None
        if skew is not None:
            host.pm.register(skew)
        trainer = Trainer(config, host)
        trainer.setup()
        trainer.train()
        if skew is not None:
            host.pm.unregister(skew)
        model, rank = trainer.model, trainer.dist.rank
        shapes = {  # (local, global) shape of each expert weight
            name: [list(p.to_local().shape if hasattr(p, "to_local") else p.shape), list(p.shape)]
            for name, p in model.named_parameters()
            if ".experts." in name
        }
        every = [None] * trainer.dist.world_size
        dist.all_gather_object(every, shapes)
        model.eval()
        with torch.no_grad():
            ids = torch.tensor([PROBE_IDS], device=trainer.dist.device)
            logits = model(input_ids=ids, use_cache=False).logits.float().cpu()
        if rank == 0:
            out = Path(config.run.output_dir)
            (out / "shapes.json").write_text(json.dumps(every))
            torch.save(logits, out / "probe_logits.pt")
        del trainer
    if dist.is_initialized():
        dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
