"""Context parallelism: activation memory per rank for one long packed row, cp = 1, 2 and 4.

A small Qwen2-shaped decoder (hidden 256, 4 layers, 8 heads, 4 key/value heads, vocabulary
1,024) in train mode runs forward and backward on one packed row (16 samples of 1,024 tokens
= 16k tokens; ``ci``: 16 × 256), on 1 process and on 2 and 4 ranks (gloo) with ``[parallel]
cp``, the model replicated (FSDP shards weights, not activations). Activation memory: the
bytes of the distinct storages autograd saves for backward during the forward (every tensor
that ``saved_tensors_hooks`` sees, the weights excluded), i.e. what the forward holds at its
end, the peak of a training step's activations, counted exactly (no allocator noise, no
timing). The figure is the largest rank's. Goal: ≤ 0.6× at cp = 2. No timing is taken: the
ranks share 2 CPU cores.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from .runner import Ratio, Result

MODEL = {
    "hidden_size": 256,
    "intermediate_size": 512,
    "num_hidden_layers": 4,
    "num_attention_heads": 8,
    "num_key_value_heads": 4,
}
SAMPLES = 16


def _saved_bytes(model: Any, step: Any) -> int:
    """Bytes of the distinct non-parameter storages autograd saves while ``step()`` runs."""
    import torch

    weights = {p.untyped_storage().data_ptr() for p in model.parameters()}
    seen: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        if storage.data_ptr() not in weights and t.device.type != "meta":
            seen[storage.data_ptr()] = storage.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = step()
    total = sum(seen.values())
    loss.backward()
    return total


def worker(sample_len: int) -> None:
    """One rank (or the single process): print this rank's activation bytes as JSON."""
    import torch
    import torch.distributed as dist

    from hyper_core.attention import register
    from hyper_core.batching.types import IGNORE_INDEX
    from hyper_core.config import ModelConfig
    from hyper_core.parallel.context_parallel import RowSplit, install_context_parallel
    from hyper_core.parallel.env import DistEnv
    from hyper_core.plugins import get_plugin_host
    from hyper_core.resolve import resolve_adapter

    torch.set_num_threads(1)
    cp = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    register()
    config = ModelConfig(
        adapter="hf_causal_lm",
        config="tiny-qwen2",
        attn_implementation="varlen",
        hf_overrides={**MODEL, "max_position_embeddings": sample_len},
    )
    torch.manual_seed(0)
    model = resolve_adapter(config, get_plugin_host().registries).build_model(config, device="cpu")
    model.train()
    if cp > 1:
        from torch.distributed.device_mesh import init_device_mesh

        dist.init_process_group("gloo")
        mesh = init_device_mesh("cpu", (cp,), mesh_dim_names=("cp",))
        install_context_parallel(model, DistEnv(rank=rank, world_size=cp, cp=cp, cp_mesh=mesh))
    length = SAMPLES * sample_len
    ids = torch.randint(3, 1000, (1, length), generator=torch.Generator().manual_seed(1))
    labels = torch.roll(ids, -1, 1)
    cu = torch.arange(0, length + 1, sample_len, dtype=torch.int32)
    positions = torch.arange(sample_len).repeat(SAMPLES).view(1, -1)
    if cp > 1:
        labels = RowSplit(cp, rank).take(labels, 1, IGNORE_INDEX)

    def step() -> Any:
        logits = model(
            input_ids=ids,
            position_ids=positions,
            cu_seq_lens_q=cu,
            cu_seq_lens_k=cu,
            max_length_q=sample_len,
            max_length_k=sample_len,
            use_cache=False,
        ).logits
        return torch.nn.functional.cross_entropy(
            logits.flatten(0, 1).float(), labels.flatten(), ignore_index=IGNORE_INDEX
        )

    print(json.dumps({"rank": rank, "bytes": _saved_bytes(model, step)}), flush=True)
    if cp > 1:
        dist.destroy_process_group()


def _measure(cp: int, sample_len: int) -> int:
    """The largest rank's activation bytes with ``cp`` ranks."""
    code = (
        "from hyper_core.parallel.exit import exit_rank\n"
        f"from bench.cp import worker\nworker({sample_len})\nexit_rank(0)\n"
    )
    script = Path(tempfile.mkdtemp()) / "cp_worker.py"
    script.write_text(code + "\n")
    if cp == 1:
        cmd = [sys.executable, str(script)]
    else:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
        cmd += ["--nproc-per-node", str(cp), str(script)]
    env = {
        **os.environ,
        "PYTHONPATH": str(Path(__file__).resolve().parents[1]),
        "OMP_NUM_THREADS": "1",
    }
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=1800, check=False, env=env)
    if proc.returncode != 0:
        raise RuntimeError(f"cp={cp} failed:\n{proc.stderr[-4000:]}")
    records = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    assert len(records) == cp, proc.stdout
    return max(r["bytes"] for r in records)


def run(size: str = "full") -> Result:
    """cp = 1 and cp = 2 on the same row (exact counts: one repeat)."""
    sample_len = 256 if size == "ci" else 1024
    result = Result("cp", "context parallelism: activation bytes per rank, one long row")
    result.params = {**MODEL, "vocab": 1024, "row_tokens": SAMPLES * sample_len}
    result.params["samples_per_row"] = SAMPLES
    for cp in (1, 2, 4):
        result.figure(f"cp{cp}_activation_bytes_per_rank", "B").values.append(
            _measure(cp, sample_len)
        )
    result.ratios["cp2_vs_cp1_activation"] = Ratio(
        "cp2_activation_bytes_per_rank", "cp1_activation_bytes_per_rank", goal="<= 0.6"
    )
    result.ratios["cp4_vs_cp1_activation"] = Ratio(
        "cp4_activation_bytes_per_rank", "cp1_activation_bytes_per_rank"
    )
    result.notes.append(
        "Ulysses keeps the whole row's q/k/v and attention output for heads / cp heads per "
        "rank (1/cp of them) and every other activation for 1/cp of the tokens."
    )
    return result


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(prog="python -m bench.cp")
    parser.add_argument("--size", choices=["ci", "full"], default="full")
    print(json.dumps(run(parser.parse_args().size).to_json(), indent=2))
