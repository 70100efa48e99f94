"""Helpers of the memory-profiler tests: tiny configs and in-process runs."""

from __future__ import annotations

import json
import pathlib
from collections.abc import Sequence
from typing import Any

REPO = pathlib.Path(__file__).resolve().parents[2]
TEXT_DEMO = REPO / "configs" / "text_demo.toml"


def _vl_available() -> bool:
    try:
        import hyper_qwen_vl  # noqa: F401
    except ImportError:
        return False
    return True


VL = _vl_available()


QWEN_TINY = 'adapter = "qwen2_5_vl"\nconfig = "tiny"\n'


def write_config(
    path: pathlib.Path, output_dir: pathlib.Path, *, extra: str = "", model: str | None = None
) -> pathlib.Path:
    """A tiny VL config on shapes (text tiny when hyper-train-qwen-vl is missing and no
    ``model`` section body is given); ``extra`` is appended (e.g. :data:`PROFILER_ON`)."""
    if VL or model is not None:
        body = f"""\
[run]
output_dir = "{output_dir}"
seed = 0

[model]
{model or QWEN_TINY}
[data]
train = {{ format = "shapes", num_samples = 24, image_size = 56 }}
max_seq_len = 256
batching = "packed"
shuffle = false

[training]
steps = 3
global_batch_size = 4
micro_batch_size = 2
lr = 1e-3

[checkpoint]
resume = "none"

[logging]
every_steps = 1
"""
    else:
        data = REPO / "configs" / "data" / "text_demo.jsonl"
        body = f"""\
[run]
output_dir = "{output_dir}"
seed = 0

[model]
adapter = "hf_causal_lm"
config = "tiny-qwen2"

[data]
train = "{data}"
max_seq_len = 256
batching = "packed"
shuffle = false

[training]
steps = 3
global_batch_size = 4
micro_batch_size = 2
lr = 1e-3

[checkpoint]
resume = "none"

[logging]
every_steps = 1
"""
    path.write_text(body + extra)
    return path


PROFILER_ON = """
[memory_profiler]
enabled = true
steps = [1, 2]
"""


def run_in_process(
    config_path: pathlib.Path,
    overrides: Sequence[str] = (),
    plugins: Sequence[tuple[str, Any]] = (),
) -> Any:
    """Train ``config_path`` in this process with the installed plugins plus ``plugins``."""
    from hyper_core.config import load_config
    from hyper_core.plugins.manager import PluginHost
    from hyper_core.trainer.run import run_training

    host = PluginHost()
    for name, obj in plugins:
        host.add_object(obj, name)
    config = load_config(config_path, list(overrides), host.registries.config_sections)
    return run_training(config, host)


def read_metrics(output_dir: pathlib.Path) -> list[dict[str, Any]]:
    """The train records of metrics.jsonl (eval records left out)."""
    lines = (output_dir / "metrics.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if "eval" not in r]


#: The published Qwen2.5-VL-7B-Instruct hyper-parameters (config.json, no weights).
QWEN25_VL_7B: dict[str, Any] = {
    "architectures": ["Qwen2_5_VLForConditionalGeneration"],
    "model_type": "qwen2_5_vl",
    "hidden_act": "silu",
    "hidden_size": 3584,
    "intermediate_size": 18944,
    "num_hidden_layers": 28,
    "num_attention_heads": 28,
    "num_key_value_heads": 4,
    "vocab_size": 152064,
    "max_position_embeddings": 128000,
    "rms_norm_eps": 1e-06,
    "rope_theta": 1000000.0,
    "rope_scaling": {"type": "mrope", "mrope_section": [16, 24, 24]},
    "tie_word_embeddings": False,
    "bos_token_id": 151643,
    "eos_token_id": 151645,
    "vision_start_token_id": 151652,
    "vision_end_token_id": 151653,
    "vision_token_id": 151654,
    "image_token_id": 151655,
    "video_token_id": 151656,
    "vision_config": {
        "depth": 32,
        "hidden_act": "silu",
        "hidden_size": 1280,
        "intermediate_size": 3420,
        "num_heads": 16,
        "in_chans": 3,
        "out_hidden_size": 3584,
        "patch_size": 14,
        "spatial_merge_size": 2,
        "spatial_patch_size": 14,
        "window_size": 112,
        "fullatt_block_indexes": [7, 15, 23, 31],
        "tokens_per_second": 2,
        "temporal_patch_size": 2,
    },
}
#: Its parameter count (embeddings and lm_head untied).
QWEN25_VL_7B_PARAMS = 8_292_166_656


def write_7b(root: pathlib.Path, extra: str = "") -> pathlib.Path:
    """A real-size Qwen2.5-VL-7B recipe (8 GPUs, FSDP2, bf16 autocast) around a weightless
    config.json; returns the TOML path."""
    model_dir = root / "qwen2_5_vl_7b"
    model_dir.mkdir(parents=True, exist_ok=True)
    (model_dir / "config.json").write_text(json.dumps(QWEN25_VL_7B, indent=1))
    toml = root / "qwen2_5_vl_7b.toml"
    toml.write_text(
        f"""\
[run]
output_dir = "{root / "run"}"

[model]
path = "{model_dir}"

[data]
train = {{ format = "shapes", num_samples = 16 }}
max_seq_len = 4096
batching = "packed"

[training]
steps = 1000
global_batch_size = 64
micro_batch_size = 1
lr = 1e-5
mixed_precision = "bf16"

[parallel]
strategy = "fsdp2"
{extra}"""
    )
    return toml
