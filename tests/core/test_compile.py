"""``[training] compile = true``: each sharding unit compiled (dynamic shapes), the same
losses as eager, and the graph/recompile counts logged."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from hyper_core.testing import run_tiny_training, tiny_text_config

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
    graphs = int(line.split(": ")[1].split()[0])
    recompiles = int(line.split(", ")[1].split()[0])
    print(line)
    assert graphs >= 1 and recompiles <= 2  # packed rows of varying length reuse the graph
