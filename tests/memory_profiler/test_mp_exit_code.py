"""``memory estimate`` as a check: exit 3 when it does not fit, a named config instead of
weights, and what to do when the model directory is missing."""

from __future__ import annotations

import json

import pytest
from mp_helpers import REPO

from hyper_core.cli import main

#: The docs' real-size recipe, estimated for a named config of the core's text adapter (no
#: model directory needed; the recipe freezes a vision tower the text model does not have).
RECIPE = [
    "memory",
    "estimate",
    str(REPO / "configs" / "qwen2_5_vl_7b.toml"),
    "--nproc-per-node",
    "8",
    "--model.adapter=hf_causal_lm",
    "--model.freeze=[]",
]


@pytest.mark.parametrize(("device", "code"), [("1MiB", 3), ("80GiB", 0)])
def test_exit_3_when_it_does_not_fit(
    device: str, code: int, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = [*RECIPE, "--model-config", "tiny-qwen2", "--device-memory", device, "--json"]
    assert main(argv) == code
    est = json.loads(capsys.readouterr().out)
    assert est["fits"] is (code == 0)
    assert est["layout"]["world_size"] == 8


def test_without_device_memory_there_is_no_verdict(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*RECIPE, "--model-config", "tiny-qwen2"]) == 0
    assert "memory estimate for" in capsys.readouterr().out


def test_a_missing_model_directory_says_config_json_is_enough(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(RECIPE) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and err.startswith("hyper-train: error: $.model.path: ")
    assert "just the model's config.json is enough" in err and "--model-config NAME" in err


def test_an_unknown_named_config_lists_the_adapters(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*RECIPE, "--model-config", "nope"]) == 2
    assert "$.model.config: adapter 'hf_causal_lm' has no config 'nope'" in capsys.readouterr().err


@pytest.mark.parametrize(("device", "code"), [("24GiB", 3), ("141GB", 0)])
def test_the_real_size_recipe_by_named_config(
    device: str, code: int, capsys: pytest.CaptureFixture[str]
) -> None:
    """The shipped 7B recipe as is (its own adapter, vision frozen), at the published size."""
    recipe = str(REPO / "configs" / "qwen2_5_vl_7b.toml")
    argv = ["memory", "estimate", recipe, "--nproc-per-node", "8", "--json"]
    assert main([*argv, "--model-config", "qwen2.5-vl-7b", "--device-memory", device]) == code
    est = json.loads(capsys.readouterr().out)
    assert est["fits"] is (code == 0)
    # 8.29 B parameters of which the vision tower's are frozen: params + grads + AdamW > 24 GiB
    # unsharded would not fit, sharded over 8 ranks the total is well under 141 GB.
    assert 24 * 2**30 < est["per_rank"]["total"] < 141e9 * 0.9
