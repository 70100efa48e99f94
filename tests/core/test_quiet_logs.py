"""Quiet logs: no library bars unless ours shows, log lines above our bar, the resolved adapter
in ``config show``, and FSDP2's view warning silenced for the root module only."""

from __future__ import annotations

import json
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any

import pytest
import tomli_w

from hyper_core.cli import main
from hyper_core.testing import tiny_text_config


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny Llama with safetensors weights (loading it shows transformers' bar)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    path = tmp_path_factory.mktemp("llama") / "model"
    config = LlamaConfig(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=1024,
        tie_word_embeddings=True,
    )
    LlamaForCausalLM(config).save_pretrained(path)
    return path


def _toml(tmp_path: Path, model_dir: Path, progress: str) -> Path:
    raw = tiny_text_config(tmp_path / "run", training={"steps": 2}, logging={"progress": progress})
    raw["model"] = {"adapter": "hf_causal_lm", "path": str(model_dir)}
    path = tmp_path / "run.toml"
    path.write_text(tomli_w.dumps(raw))
    return path


def test_progress_none_shows_no_loading_bar(
    tmp_path: Path, model_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from transformers.utils import logging as hf_logging

    assert main(["run", str(_toml(tmp_path, model_dir, "none"))]) == 0
    err = capsys.readouterr().err
    assert "Loading weights" not in err and "it/s" not in err, err
    assert hf_logging.is_progress_bar_enabled()  # restored after the run


def test_log_lines_go_above_the_bar(tmp_path: Path, model_dir: Path) -> None:
    toml = _toml(tmp_path, model_dir, "bar")
    proc = subprocess.run(
        [sys.executable, "-m", "hyper_core", "run", str(toml)],
        capture_output=True,  # bytes: the bar's carriage returns kept
        timeout=300,
        check=False,
    )
    err = proc.stderr.decode()
    assert proc.returncode == 0, err[-3000:]
    assert "train:" in err  # the bar was drawn
    [segment] = [s for s in err.split("\r") if "saved checkpoint" in s]
    assert segment.startswith("hyper-train: saved checkpoint"), repr(segment)


def test_config_show_names_the_adapter_it_resolves(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"model_type": "qwen2_5_vl"}))
    raw: dict[str, Any] = tiny_text_config(tmp_path / "run")
    raw["model"] = {"path": str(model)}
    toml = tmp_path / "c.toml"
    toml.write_text(tomli_w.dumps(raw))
    assert main(["config", "show", str(toml)]) == 0
    assert 'adapter = "qwen2_5_vl"' in capsys.readouterr().out


def test_fsdp2_view_warning_is_silenced_for_the_root_only(tmp_path: Path) -> None:
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    from hyper_core.parallel.fsdp2 import ignore_root_view_warning

    class Unit(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.linear = torch.nn.Linear(4, 4)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.linear(x)[:, :2]  # a view

    class Root(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.unit = Unit()
            self.head = torch.nn.Linear(2, 4)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.head(self.unit(x))[:, :3]  # a view

    store = dist.FileStore(str(tmp_path / "store"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        mesh = init_device_mesh("cpu", (1,))
        model = Root()
        fully_shard(model.unit, mesh=mesh)
        fully_shard(model, mesh=mesh)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            ignore_root_view_warning(model)
            model(torch.randn(2, 4)).sum().backward()
    finally:
        dist.destroy_process_group()
    views = [str(w.message) for w in caught if "returned a view tensor" in str(w.message)]
    assert views and all(m.startswith("FSDP2-wrapped module (FSDPUnit)") for m in views), views


def test_export_and_chat_show_no_library_bars_in_piped_logs(
    tmp_path: Path, model_dir: Path
) -> None:
    """``export`` writes and ``chat`` loads weights through transformers, whose bars animate
    with carriage returns; with stderr piped (a log file) there must be none."""
    toml = _toml(tmp_path, model_dir, "none")
    env_cli = [sys.executable, "-m", "hyper_core"]
    assert subprocess.run([*env_cli, "run", str(toml)], capture_output=True).returncode == 0
    out = tmp_path / "run"
    export = subprocess.run(
        [*env_cli, "export", str(out), "--out", str(tmp_path / "hf")],
        capture_output=True,
        text=True,
    )
    assert export.returncode == 0, export.stderr
    chat = subprocess.run(
        [*env_cli, "chat", str(tmp_path / "hf"), "--prompt", "hi", "--max-new-tokens", "2"],
        capture_output=True,
        text=True,
    )
    assert chat.returncode == 0, chat.stderr
    for proc in (export, chat):
        assert "it/s" not in proc.stderr and "\r" not in proc.stderr, proc.stderr
