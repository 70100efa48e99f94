"""``[training] compile = true``: each sharding unit compiled (dynamic shapes) as one graph
(zero graph breaks, the last decoder layer at label rows included), the same losses as
eager, and the graph/recompile/graph-break counts logged."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest

from hyper_core.testing import run_tiny_training, tiny_text_config

#: Compiles per kind of unit and call (seen: 3 for the tiny text model, 3 for the tiny
#: Qwen2.5-VL with flash_varlen, the same at 3 and 10 steps); more means shapes specialise.
RECOMPILES_TEXT = 3
RECOMPILES_VL = 4


def counts(line: str) -> tuple[int, int, int]:
    """(graphs, recompiles, graph breaks) of the run's ``torch.compile:`` end line."""
    graphs, recompiles, breaks = (int(part.split()[0]) for part in line.split(": ")[1].split(", "))
    return graphs, recompiles, breaks


pytestmark = pytest.mark.slow  # compiling takes ~30 s on 2 CPU cores


def test_compiled_units_train_like_eager(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    eager = run_tiny_training(tiny_text_config(tmp_path / "eager"), steps=5)
    with caplog.at_level(logging.INFO, logger="hyper_train"):
        compiled = run_tiny_training(
            tiny_text_config(tmp_path / "compiled", training={"compile": True}), steps=5
        )
    layers = [
        m for n, m in compiled.trainer.unwrapped_model.named_modules() if n.endswith("layers.0")
    ]
    assert layers and getattr(layers[0], "_compiled_call_impl", None) is not None
    assert compiled.losses == pytest.approx(eager.losses, abs=1e-4)
    [line] = [r.getMessage() for r in caplog.records if r.getMessage().startswith("torch.compile")]
    graphs, recompiles, breaks = counts(line)
    print(line)
    assert graphs >= 1 and recompiles <= RECOMPILES_TEXT  # rows of any length reuse the graphs
    assert breaks == 0


def _vl_config(out: Path, **training: Any) -> dict[str, Any]:
    return {
        "run": {"output_dir": str(out)},
        "model": {"adapter": "qwen2_5_vl", "config": "tiny", "attn_implementation": "flash_varlen"},
        "data": {"train": {"format": "shapes", "num_samples": 40, "image_size": 56}},
        "training": {
            "steps": 5,
            "global_batch_size": 8,
            "micro_batch_size": 8,  # one packed row of 8 samples: 8 segments per attention
            "lr": 1e-3,
            **training,
        },
        "logging": {"every_steps": 1, "progress": "none"},
    }


def test_compiled_vl_units_with_flash_varlen_are_one_graph_each(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Packed rows of several samples: the varlen kernel is a custom op taking the row's
    boundaries (``hyper_train::varlen_attn`` on CPU), so each vision block and decoder layer,
    the last one at label rows too, is one graph whatever the row lengths and label counts."""
    plugins = ["hyper_qwen_vl.plugin"]
    eager = run_tiny_training(_vl_config(tmp_path / "eager"), plugins=plugins)
    with caplog.at_level(logging.INFO, logger="hyper_train"):
        compiled = run_tiny_training(
            _vl_config(tmp_path / "compiled", compile=True), plugins=plugins
        )
    assert len(compiled.losses) == 5
    assert compiled.losses == pytest.approx(eager.losses, abs=1e-4)
    [line] = [r.getMessage() for r in caplog.records if r.getMessage().startswith("torch.compile")]
    print(line)
    graphs, recompiles, breaks = counts(line)
    assert graphs >= 1 and breaks == 0
    # one compile per kind of unit (vision block, decoder layer, the last layer at label
    # rows), not one per row length or label count: 5 steps of new lengths add none
    assert recompiles <= RECOMPILES_VL
    counted = compiled.trainer.attention_counts
    assert counted.fallbacks == {} and counted.kernel_calls > 0
