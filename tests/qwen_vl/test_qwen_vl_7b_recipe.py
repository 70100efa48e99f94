"""The real-size recipe validates and its model builds on the meta device at full size."""

from __future__ import annotations

import json
from pathlib import Path

from hyper_core.cli import main
from hyper_core.config import load_config
from hyper_core.testing import isolated_host

REPO = Path(__file__).resolve().parents[2]
RECIPE = REPO / "configs" / "qwen2_5_vl_7b.toml"

# The published Qwen2.5-VL-7B-Instruct architecture (config.json without weights).
CONFIG_7B = {
    "model_type": "qwen2_5_vl",
    "architectures": ["Qwen2_5_VLForConditionalGeneration"],
    "image_token_id": 151655,
    "video_token_id": 151656,
    "vision_start_token_id": 151652,
    "vision_end_token_id": 151653,
    "tie_word_embeddings": False,
    "text_config": {
        "model_type": "qwen2_5_vl_text",
        "hidden_size": 3584,
        "intermediate_size": 18944,
        "num_hidden_layers": 28,
        "num_attention_heads": 28,
        "num_key_value_heads": 4,
        "vocab_size": 152064,
        "max_position_embeddings": 128000,
        "rms_norm_eps": 1e-6,
        "rope_parameters": {
            "rope_type": "default",
            "rope_theta": 1000000.0,
            "mrope_section": [16, 24, 24],
        },
    },
    "vision_config": {
        "depth": 32,
        "hidden_size": 1280,
        "intermediate_size": 3420,
        "num_heads": 16,
        "out_hidden_size": 3584,
        "patch_size": 14,
        "spatial_merge_size": 2,
        "temporal_patch_size": 2,
        "window_size": 112,
        "fullatt_block_indexes": [7, 15, 23, 31],
    },
}


def test_recipe_validates(capsys) -> None:
    assert main(["config", "validate", str(RECIPE)]) == 0
    assert "ok" in capsys.readouterr().out


def test_recipe_model_builds_on_meta_at_full_size(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps(CONFIG_7B))
    host = isolated_host(["hyper_qwen_vl.plugin"])
    config = load_config(RECIPE, [f"--model.path={tmp_path}"], host.registries.config_sections)
    adapter = host.registries.model_adapters.get(config.model.adapter)()
    model = adapter.build_model(config.model, device="meta")
    total = sum(p.numel() for p in model.parameters())
    assert abs(total - 8.29e9) / 8.29e9 < 0.01, total  # 8.29 B published
    assert {p.device.type for p in model.parameters()} == {"meta"}
    plan = adapter.parallel_plan(model)
    from hyper_core.adapters.hf import match_modules

    units = match_modules(model, plan.sharding_units)
    assert len(units) == 28 + 32
