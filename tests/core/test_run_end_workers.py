"""A run shuts its training data workers down when it ends, even by an exception, not whenever
the garbage collector reaches its data iterator: a traceback kept by the caller (as
``pytest.raises`` keeps it) holds the iterator, and its collection later joined each worker
with a 5 s timeout in some unrelated place (a 20 s stall inside the test suite)."""

from __future__ import annotations

import gc
import multiprocessing
import os
from pathlib import Path

import pytest

from hyper_core import hookimpl
from hyper_core.config import load_config_dict
from hyper_core.parallel.rank_status import _data_worker_death
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
        # A report still names a dead worker by its id, from the loader's record.
        (pid,) = trainer.dataloaders.train.worker_ids
        died = f"DataLoader worker (pid {pid}) is killed by signal: Killed."
        assert (
            _data_worker_death(died)
            == f"data worker 0 of rank {os.environ.get('RANK', '0')} died (signal 9)"
        )
    finally:
        gc.enable()
