"""``[checkpoint] export_dtype``: the dtype of the end-of-run export (``export_hf``)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

from hyper_core.config import load_config_dict
from hyper_core.errors import ConfigError
from hyper_core.testing import run_tiny_training, tiny_text_config


def _dtypes(out: Path) -> set[torch.dtype]:
    found = set()
    for file in out.glob("*.safetensors"):
        with safe_open(str(file), "pt") as f:
            found.update(f.get_tensor(k).dtype for k in f.keys())
    return found


@pytest.mark.parametrize(
    ("choice", "dtype", "name"),
    [("bf16", torch.bfloat16, "bfloat16"), ("auto", torch.float32, "float32")],
)
def test_export_hf_writes_the_chosen_dtype(
    choice: str, dtype: torch.dtype, name: str, tmp_path: Path
) -> None:
    checkpoint = {"export_hf": True, "export_dtype": choice}
    run = run_tiny_training(
        tiny_text_config(tmp_path, training={"steps": 1}, checkpoint=checkpoint)
    )
    hf = tmp_path / "hf"
    assert _dtypes(hf) == {dtype}  # auto: the trained parameters' ([model] dtype float32)
    assert json.loads((hf / "config.json").read_text())["dtype"] == name
    with safe_open(str(next(hf.glob("*.safetensors"))), "pt") as f:
        key = next(iter(f.keys()))
        trained = dict(run.trainer.unwrapped_model.state_dict())[key]
        assert torch.equal(f.get_tensor(key), trained.detach().to(dtype))


def test_an_unknown_export_dtype_is_a_config_error(tmp_path: Path) -> None:
    raw = tiny_text_config(tmp_path, checkpoint={"export_dtype": "int8"})
    with pytest.raises(ConfigError) as info:
        load_config_dict(raw)
    assert "$.checkpoint.export_dtype" in dict(info.value.problems)
