"""A save that must not happen or cannot finish: non-finite weights are never saved, a full disk
is one line naming ENOSPC and the path; either way ``latest`` stays the last complete one."""

from __future__ import annotations

import errno
import logging
from pathlib import Path
from typing import Any

import pytest

from hyper_core import hookimpl
from hyper_core.cli import main
from hyper_core.config import dump_config, load_config_dict
from hyper_core.errors import RunFailed
from hyper_core.testing import run_tiny_training, tiny_text_config


def _config(out: Path, steps: int = 4, **checkpoint: Any) -> dict[str, Any]:
    ckpt = {"every_steps": 2, "keep_last": 1, "resume": "none", **checkpoint}
    return tiny_text_config(out, training={"steps": steps}, checkpoint=ckpt)


def _fill_disk_after_first_save(monkeypatch: pytest.MonkeyPatch) -> None:
    """DCP's writes fail with ENOSPC once the first checkpoint is complete."""
    import torch.distributed.checkpoint.filesystem as fs

    from hyper_core.checkpoint import Checkpointer

    real_finish = Checkpointer._finish

    def write_item(*args: Any, **kwargs: Any) -> None:
        raise OSError(errno.ENOSPC, "No space left on device", "/disk/full")

    def finish(self: Checkpointer, *args: Any) -> None:
        real_finish(self, *args)
        monkeypatch.setattr(fs, "_write_item", write_item)

    monkeypatch.setattr(Checkpointer, "_finish", finish)


@pytest.mark.parametrize("async_save", [False, True], ids=["sync", "async"])
def test_a_full_disk_keeps_the_last_complete_checkpoint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, async_save: bool
) -> None:
    _fill_disk_after_first_save(monkeypatch)
    with pytest.raises(RunFailed) as err:
        run_tiny_training(_config(tmp_path, **{"async": async_save}))
    ckpts = tmp_path / "checkpoints"
    assert str(err.value) == (
        "could not write checkpoint step-4: ENOSPC (No space left on device) at /disk/full; "
        f"latest is still step-2 ({ckpts / 'step-2'})"
    )
    assert sorted(p.name for p in ckpts.iterdir()) == ["latest", "step-2"]  # no torn .tmp
    assert (ckpts / "latest").read_text() == "step-2"


def test_a_full_disk_on_the_first_file_of_a_checkpoint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from hyper_core.checkpoint import ModelIdentity

    def to_json(self: ModelIdentity) -> str:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(ModelIdentity, "to_json", to_json)
    with pytest.raises(RunFailed) as err:
        run_tiny_training(_config(tmp_path, steps=2))
    ckpts = tmp_path / "checkpoints"
    assert str(err.value) == (
        f"could not write checkpoint step-2: ENOSPC (No space left on device) at "
        f"{ckpts / '.tmp-step-2'}; no checkpoint was saved before"
    )
    assert list(ckpts.iterdir()) == []


def _short_write_after_first_save(monkeypatch: pytest.MonkeyPatch) -> None:
    """DCP's writes fail the way ``torch.save``'s zip writer reports a short write."""
    import torch.distributed.checkpoint.filesystem as fs

    from hyper_core.checkpoint import Checkpointer

    real_finish = Checkpointer._finish

    def write_item(*args: Any, **kwargs: Any) -> None:
        raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 704 vs 598")

    def finish(self: Checkpointer, *args: Any) -> None:
        real_finish(self, *args)
        monkeypatch.setattr(fs, "_write_item", write_item)

    monkeypatch.setattr(Checkpointer, "_finish", finish)


def test_a_short_write_on_a_full_disk_is_named_enospc(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import hyper_core.checkpoint.checkpointer

    _short_write_after_first_save(monkeypatch)
    monkeypatch.setattr(hyper_core.checkpoint.checkpointer, "_free_bytes", lambda path: 8192)
    with pytest.raises(RunFailed) as err:
        run_tiny_training(_config(tmp_path))
    ckpts = tmp_path / "checkpoints"
    assert str(err.value) == (
        "could not write checkpoint step-4: ENOSPC (No space left on device) at "
        f"{ckpts / '.tmp-step-4'} (8 KiB left; RuntimeError: [enforce fail at "
        "inline_container.cc:672] . unexpected pos 704 vs 598); "
        f"latest is still step-2 ({ckpts / 'step-2'})"
    )
    assert sorted(p.name for p in ckpts.iterdir()) == ["latest", "step-2"]


def test_another_write_failure_keeps_its_traceback_and_removes_the_partial_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _short_write_after_first_save(monkeypatch)  # with the disk far from full
    with pytest.raises(BaseException, match="unexpected pos 704 vs 598"):
        run_tiny_training(_config(tmp_path))
    ckpts = tmp_path / "checkpoints"
    assert sorted(p.name for p in ckpts.iterdir()) == ["latest", "step-2"]


class _PoisonWeights:
    """Puts a NaN into one weight after step ``at``."""

    def __init__(self, at: int) -> None:
        self.at = at

    @hookimpl
    def on_step_end(self, trainer: Any, state: Any) -> None:
        if state.global_step == self.at:
            import torch

            with torch.no_grad():
                trainer.unwrapped_model.model.norm.weight[0] = float("nan")


def test_non_finite_weights_are_never_saved(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.ERROR, logger="hyper_train"), pytest.raises(RunFailed) as err:
        run_tiny_training(_config(tmp_path), plugins=[_PoisonWeights(at=4)])
    ckpts = tmp_path / "checkpoints"
    assert str(err.value) == (
        "step 4: the model's weights are not finite (model.norm.weight): checkpoint step-4 not "
        f"saved; latest is still step-2 ({ckpts / 'step-2'})"
    )
    assert "step 4: parameter model.norm.weight is not finite" in caplog.text
    # not written, `latest` untouched, nothing pruned (keep_last = 1)
    assert sorted(p.name for p in ckpts.iterdir()) == ["latest", "step-2"]
    assert (ckpts / "latest").read_text() == "step-2"


def test_cli_full_disk_is_one_line_and_exit_1(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _fill_disk_after_first_save(monkeypatch)
    config = tmp_path / "run.toml"
    config.write_text(dump_config(load_config_dict(_config(tmp_path / "out"))))
    assert main(["run", str(config)]) == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err
    errors = [line for line in err.splitlines() if line.startswith("hyper-train: error:")]
    assert errors == [
        "hyper-train: error: could not write checkpoint step-4: ENOSPC (No space left on "
        f"device) at /disk/full; latest is still step-2 ({tmp_path / 'out' / 'checkpoints'}"
        "/step-2)"
    ]
