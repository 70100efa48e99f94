"""``[model.options]``: declared by the adapter, validated with ``$.model.options.KEY`` paths
and no torch; Qwen-VL's image token budgets change the processor."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from qwen_vl_helpers import ADAPTERS, model_config

from hyper_core.cli import main
from hyper_core.config import load_config_dict
from hyper_core.config.adapter_options import check_adapter_options
from hyper_core.errors import ConfigError
from hyper_core.plugins.manager import PluginHost
from hyper_core.testing.processes import subprocess_env
from hyper_kimi_k26.adapter import KimiK25Adapter
from hyper_qwen_vl.tokens import OFFLINE_IDS

IMAGE_PAD = OFFLINE_IDS["<|image_pad|>"]


def config_with(options: dict[str, Any], **model: Any) -> dict[str, Any]:
    return {
        "model": {"adapter": "qwen2_vl", "config": "tiny", "options": options, **model},
        "data": {"train": {"format": "shapes", "num_samples": 4}},
        "training": {"steps": 1, "global_batch_size": 1, "micro_batch_size": 1, "lr": 1e-3},
    }


@pytest.mark.parametrize(
    ("options", "model", "message"),
    [
        (
            {"max_image_tokens": "lots"},
            {},
            "$.model.options.max_image_tokens: expected int, got str ('lots')",
        ),
        ({"tile_size": 512}, {}, "$.model.options.tile_size: unknown key"),
        ({"max_image_tokens": 0}, {}, "$.model.options.max_image_tokens: must be >= 1, got 0"),
        (
            {"min_image_tokens": 8, "max_image_tokens": 4},
            {},
            "$.model.options.max_image_tokens: must be >= min_image_tokens (8)",
        ),
        (
            {"max_image_tokens": 4},
            {"max_pixels": 12544},
            "$.model.options.max_image_tokens: set this or [model] max_pixels, not both",
        ),
    ],
)
def test_bad_options_name_their_path(
    options: dict[str, Any], model: dict[str, Any], message: str
) -> None:
    config = load_config_dict(config_with(options, **model))
    with pytest.raises(ConfigError) as err:
        check_adapter_options(config, PluginHost(entry_points=True).registries)
    assert str(err.value).startswith(message), str(err.value)


def test_an_adapter_without_options_takes_none() -> None:
    with pytest.raises(ConfigError, match=r"\$\.model\.options: adapter 'kimi_k25' takes no"):
        KimiK25Adapter.parse_options(model_config("qwen2_vl", options={"tile_size": 512}))
    assert KimiK25Adapter.parse_options(model_config("qwen2_vl")) is None


def test_an_unresolvable_adapter_is_left_to_the_run(tmp_path: Path) -> None:
    raw = config_with({"tile_size": 512})
    raw["model"] = {"path": str(tmp_path / "absent"), "options": {"tile_size": 512}}
    check_adapter_options(load_config_dict(raw), PluginHost().registries)


def test_validation_imports_no_torch(tmp_path: Path) -> None:
    code = (
        "import sys\n"
        "from hyper_core.config import load_config_dict\n"
        "from hyper_core.config.adapter_options import check_adapter_options\n"
        "from hyper_core.plugins.manager import PluginHost\n"
        f"config = load_config_dict({config_with({'tile_size': 512})!r})\n"
        "try:\n"
        "    check_adapter_options(config, PluginHost().registries)\n"
        "except Exception as exc:\n"
        "    print(exc)\n"
        "print(sorted(m for m in ('torch', 'transformers') if m in sys.modules))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        env=subprocess_env(),
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    ).stdout.splitlines()
    assert out[0].startswith("$.model.options.tile_size: unknown key"), out
    assert out[-1] == "[]"


def test_run_stops_on_a_bad_option_before_building(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = tmp_path / "cfg.toml"
    cfg.write_text(
        f'[run]\noutput_dir = "{tmp_path / "out"}"\n'
        '[model]\nadapter = "qwen2_vl"\nconfig = "tiny"\n'
        "[model.options]\ntile_size = 512\n"
        '[data]\ntrain = { format = "shapes", num_samples = 4 }\n'
        "[training]\nsteps = 1\nglobal_batch_size = 1\nmicro_batch_size = 1\nlr = 1e-3\n"
    )
    code = main(["run", str(cfg)])
    err = capsys.readouterr().err
    assert code == 2, err
    # checked with the rest of the config, before any model is built
    assert err.startswith(f"hyper-train: error: {cfg}: $.model.options.tile_size: unknown key"), err
    assert not (tmp_path / "out").exists()
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1


def image_tokens(family: str, samples: list[dict[str, Any]], **options: int) -> list[int]:
    """LLM tokens per image of ``samples`` with these ``[model.options]``."""
    adapter = ADAPTERS[family]()
    assets = adapter.build_assets(model_config(family, options=options))
    counts = []
    for sample in samples:
        features = adapter.transform(sample, assets, max_seq_len=4096)
        grid = features.media.get("image_grid_thw")
        if grid is not None:
            counts += (grid.prod(-1) // assets.processor.merge_size**2).tolist()
            assert int((features.input_ids == IMAGE_PAD).sum()) == sum(counts[-len(grid) :])
    return counts


@pytest.mark.parametrize(("family", "side"), [("qwen2_vl", 28), ("qwen3_vl", 32)])
def test_image_token_budgets_change_the_processor(
    family: str, side: int, samples: list[dict[str, Any]]
) -> None:
    default = image_tokens(family, samples)
    # 2 is below the family's default least area (4 tokens), which follows it down
    small = image_tokens(family, samples, max_image_tokens=2)
    large = image_tokens(family, samples, min_image_tokens=40)
    assert max(default) > 2 and min(default) < 40, default
    assert all(n <= 2 for n in small), small
    assert all(n >= 40 for n in large), large
    assets = ADAPTERS[family]().build_assets(model_config(family, options={"max_image_tokens": 7}))
    assert assets.processor.max_pixels == 7 * side * side


def test_the_error_names_the_config_file() -> None:
    config = load_config_dict(config_with({"tile_size": 512}))
    with pytest.raises(ConfigError) as err:
        check_adapter_options(config, PluginHost().registries, source="cfg.toml")
    assert str(err.value).startswith("cfg.toml: $.model.options.tile_size: unknown key")
