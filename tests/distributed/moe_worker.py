"""Runs the expert-parallel jobs of ``test_expert_parallel.py`` in one torchrun launch.

    python -m torch.distributed.run --standalone --nproc-per-node N moe_worker.py JOBS.json

``JOBS.json`` is a list of ``{"config": RAW_CONFIG, "skew": bool}``. With ``skew`` the run
routes every token to experts 0 and 1 (:mod:`moe_routing`). Rank 0 writes, into each job's
output_dir, ``shapes.json``: every rank's local and global shape of each expert weight, and
``probe_logits.pt``: the trained model's logits on fixed ids, and ``tokens.json``: every
rank's count of the tokens and patches given to the model, of the tokens its first decoder
layer ran on and of the patches its vision tower encoded.
"""

from __future__ import annotations

import json
import os
import sys
import warnings
from pathlib import Path
from typing import Any

PROBE_IDS = list(range(3, 35))


def main(jobs_file: str) -> None:
    import torch
    import torch.distributed as dist
    from moe_routing import SkewedRouting

    from hyper_core.config import load_config_dict
    from hyper_core.parallel.cp_vision import SplitTower
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
        seen = count_decoder_tokens(trainer.unwrapped_model)
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
        towers = [m.forward for m in model.modules() if isinstance(m.forward, SplitTower)]
        seen["encoded"] = towers[0].patches_encoded if towers else seen["patches"]
        tokens = [None] * trainer.dist.world_size
        dist.all_gather_object(tokens, seen)
        if rank == 0:
            out = Path(config.run.output_dir)
            (out / "shapes.json").write_text(json.dumps(every))
            (out / "tokens.json").write_text(json.dumps(tokens))
            torch.save(logits, out / "probe_logits.pt")
        del trainer
    if dist.is_initialized():
        dist.destroy_process_group()


def count_decoder_tokens(model: Any) -> dict[str, int]:
    """Counts, over training forwards, the rows, tokens and vision patches given to the model
    and the tokens its first decoder layer runs on (fewer under ``[parallel] cp``)."""
    seen = {"model": 0, "rows": 0, "decoder": 0, "patches": 0}

    def model_tokens(module: Any, args: tuple, kwargs: dict) -> None:
        if module.training:
            seen["model"] += kwargs["input_ids"].numel()
            seen["rows"] += kwargs["input_ids"].shape[0]
            for key in ("pixel_values", "pixel_values_videos"):
                if kwargs.get(key) is not None:
                    seen["patches"] += kwargs[key].shape[0]

    def layer_tokens(module: Any, args: tuple, kwargs: dict) -> None:
        if module.training:
            hidden = args[0] if args else kwargs["hidden_states"]
            seen["decoder"] += hidden.shape[0] * hidden.shape[1]

    model.register_forward_pre_hook(model_tokens, with_kwargs=True)
    model.get_decoder().layers[0].register_forward_pre_hook(layer_tokens, with_kwargs=True)
    return seen


if __name__ == "__main__":
    from hyper_core.parallel.exit import exit_rank

    main(sys.argv[1])
    exit_rank(0)  # no interpreter finalisation: see hyper_core.parallel.exit
