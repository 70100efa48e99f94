"""``hyper-train export --dtype``: the written safetensors (and config.json) have the chosen
dtype; ``auto`` is the dtype of ``[model] path``'s config.json (fp32 master weights trained
from a bf16 checkpoint go back out as bf16), else ``[model] dtype``."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors import safe_open

from hyper_core.cli import main


@pytest.fixture(scope="module")
def text_run(tmp_path_factory: pytest.TempPathFactory) -> Any:
    from hyper_core.config import dump_config, load_config_dict
    from hyper_core.testing import run_tiny_training, tiny_text_config

    out = tmp_path_factory.mktemp("export-dtype-run")
    raw = tiny_text_config(out, training={"steps": 2}, checkpoint={"every_steps": 2})
    run = run_tiny_training(raw)
    (out / "run.toml").write_text(dump_config(load_config_dict(raw)))
    return run


def _export(run: Any, target: Path, *extra: str, config: Path | None = None) -> int:
    out = Path(run.trainer.config.run.output_dir)
    ckpt = out / "checkpoints" / "step-2"
    config = config or out / "run.toml"
    return main(["export", str(ckpt), "--out", str(target), "--config", str(config), *extra])


def _dtypes(out: Path) -> set[torch.dtype]:
    found = set()
    for file in out.glob("*.safetensors"):
        with safe_open(str(file), "pt") as f:
            found.update(f.get_tensor(k).dtype for k in f.keys())
    return found


def _config_dtype(out: Path) -> str:
    return json.loads((out / "config.json").read_text())["dtype"]


def _logits(model: torch.nn.Module) -> torch.Tensor:
    with torch.no_grad():
        ids = torch.tensor([list(range(3, 35))])
        return model.eval()(input_ids=ids, use_cache=False).logits.float()


def _reload(out: Path) -> torch.nn.Module:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(out), local_files_only=True)


def test_bf16_and_fp16_exports_reload_with_the_trained_weights(
    text_run: Any, tmp_path: Path
) -> None:
    trained = text_run.trainer.unwrapped_model
    for choice, dtype, name in (
        ("bf16", torch.bfloat16, "bfloat16"),
        ("fp16", torch.float16, "float16"),
    ):
        target = tmp_path / choice
        assert _export(text_run, target, "--dtype", choice) == 0
        assert _dtypes(target) == {dtype}
        assert _config_dtype(target) == name
        loaded = _reload(target)
        assert {p.dtype for p in loaded.parameters()} == {dtype}
        trained_weights = dict(trained.named_parameters())
        for key, tensor in loaded.named_parameters():  # the trained weights rounded once
            assert torch.equal(tensor, trained_weights[key].detach().to(dtype)), key
        torch.testing.assert_close(_logits(loaded), _logits(trained), atol=5e-2, rtol=2e-2)


def test_auto_on_a_named_config_writes_the_model_dtype(text_run: Any, tmp_path: Path) -> None:
    assert _export(text_run, tmp_path / "hf") == 0  # auto: no source checkpoint, [model] dtype
    assert _dtypes(tmp_path / "hf") == {torch.float32}
    assert _config_dtype(tmp_path / "hf") == "float32"


def test_auto_follows_the_source_checkpoint_dtype(text_run: Any, tmp_path: Path) -> None:
    """A run with fp32 master weights from a bf16 checkpoint: auto exports bf16, ``fp32``
    keeps the trained fp32 weights (logits within 1e-5)."""
    import tomllib

    from hyper_core.config import dump_config, load_config_dict

    trained = text_run.trainer.unwrapped_model
    source = tmp_path / "source"
    copy.deepcopy(trained).to(torch.bfloat16).save_pretrained(str(source))
    assert _config_dtype(source) == "bfloat16"
    run_config = Path(text_run.trainer.config.run.output_dir) / "run.toml"
    raw = tomllib.loads(run_config.read_text())
    raw["model"] = {"adapter": "hf_causal_lm", "path": str(source), "dtype": "float32"}
    from_path = tmp_path / "from-path.toml"
    from_path.write_text(dump_config(load_config_dict(raw)))

    assert _export(text_run, tmp_path / "auto", config=from_path) == 0
    assert _dtypes(tmp_path / "auto") == {torch.bfloat16}
    assert _config_dtype(tmp_path / "auto") == "bfloat16"

    assert _export(text_run, tmp_path / "fp32", "--dtype", "fp32", config=from_path) == 0
    assert _dtypes(tmp_path / "fp32") == {torch.float32}
    assert _config_dtype(tmp_path / "fp32") == "float32"
    torch.testing.assert_close(
        _logits(_reload(tmp_path / "fp32")), _logits(trained), atol=1e-5, rtol=0
    )


def test_an_unknown_dtype_is_a_usage_error(
    text_run: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_:
        _export(text_run, tmp_path / "hf", "--dtype", "int8")
    assert exit_.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("hyper-train export: error: argument --dtype: invalid choice"), err
    assert not (tmp_path / "hf").exists()
