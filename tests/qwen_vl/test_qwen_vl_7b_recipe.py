"""The real-size recipe validates and its model builds on the meta device at full size."""

from __future__ import annotations

import json
from pathlib import Path

from hyper_core.cli import main
from hyper_core.config import load_config
from hyper_core.testing import isolated_host
from hyper_qwen_vl.configs import QWEN2_5_VL

REPO = Path(__file__).resolve().parents[2]
RECIPE = REPO / "configs" / "qwen2_5_vl_7b.toml"

CONFIG_7B = QWEN2_5_VL["qwen2.5-vl-7b"]


def test_recipe_validates(capsys) -> None:
    # The recipe names the user's data, which is not here: validate says so.
    assert main(["config", "validate", str(RECIPE)]) == 2
    err = capsys.readouterr().err
    assert f"$.data.train: data file not found: {RECIPE.parent}/data/train.jsonl" in err
    assert f"$.data.eval: data file not found: {RECIPE.parent}/data/eval.jsonl" in err
    data = RECIPE.parent / "data" / "text_demo.jsonl"
    assert (
        main(["config", "validate", str(RECIPE), f"--data.train={data}", f"--data.eval={data}"])
        == 0
    )
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
