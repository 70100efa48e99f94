"""A run shuts its training data workers down when it ends, even by an exception, not whenever
the garbage collector reaches its data iterator: a traceback kept by the caller (as
``pytest.raises`` keeps it) holds the iterator, and its collection later joined each worker
with a 5 s timeout in some unrelated place (a 20 s stall inside the test suite)."""

from __future__ import annotations

import gc
import multiprocessing
from pathlib import Path

import pytest

from hyper_core import hookimpl
from hyper_core.config import load_config_dict
from hyper_core.testing import isolated_host, tiny_text_config
from hyper_core.trainer.trainer import Trainer


class _FailAtStep2:
    @hookimpl
    def on_step_end(self, state: object) -> None:
        if getattr(state, "global_step", 0) == 2:
            raise RuntimeError("deliberate")


def test_a_failed_run_leaves_no_data_worker_behind(tmp_path: Path) -> None:
    raw = tiny_text_config(tmp_path, training={"steps": 4})
    raw["data"]["num_workers"] = 1
    host = isolated_host([_FailAtStep2()])
    config = load_config_dict(raw, sections=host.registries.config_sections)
    trainer = Trainer(config, host)
    before = set(multiprocessing.active_children())
    gc.disable()  # only the run itself may end them here
    try:
        with pytest.raises(RuntimeError, match="deliberate") as caught:
            trainer.train()
        assert caught.traceback  # still held, with the train loop's frame
        assert trainer.state.global_step == 2
        assert set(multiprocessing.active_children()) - before == set()
    finally:
        gc.enable()
