"""Load: seconds and peak RSS per rank ÷ checkpoint size, 1/2/4 ranks, rank-0 path vs sharded.

A random Qwen2.5-VL-shaped checkpoint (fp32 safetensors in 400 MB files; 1.5 GB full, 300 MB
ci) is loaded by the real ``build_model``/``parallelize_model`` stages under fsdp2
(:mod:`hyper_core.testing.load_probe`). One rank has one path (``from_pretrained``). The RSS
figure is the worst rank's; seconds are the slowest rank's (ranks share 2 cores here).
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from hyper_core.testing import load_probe

from .runner import Result


def run(size: str = "full") -> Result:
    """Each (ranks, path) once per repeat, interleaved."""
    target = 300_000_000 if size == "ci" else 1_500_000_000
    repeats = 1 if size == "ci" else 2
    result = Result("load", "model load from an HF directory: peak RSS per rank and seconds")
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        checkpoint = root / "hf"
        nbytes = load_probe.write_random_checkpoint(checkpoint, target, max_shard_size="400MB")
        result.params = {
            "checkpoint_bytes": nbytes,
            "files": len(list(checkpoint.glob("*.safetensors"))),
        }
        from hyper_core.config import dump_config, load_config_dict

        raw = load_probe.run_config(load_probe.model_section(checkpoint), root / "run")
        config = root / "run.toml"
        config.write_text(dump_config(load_config_dict(raw)))
        cases = [(1, "sharded"), (2, "rank0"), (2, "sharded"), (4, "rank0"), (4, "sharded")]
        for _ in range(repeats):
            for ranks, path in cases:
                flags = ("--rank0",) if path == "rank0" else ()
                rec = load_probe.launch(config, root / "probe.json", ranks, *flags)
                name = f"{ranks}rank_{path}" if ranks > 1 else "1rank"
                peak = max(rec["peak_rss_bytes"]) / nbytes
                result.figure(f"{name}_peak_rss_per_checkpoint", "ratio").values.append(peak)
                result.figure(f"{name}_seconds", "s").values.append(max(rec["seconds"]))
    return result
