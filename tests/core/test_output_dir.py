"""``[run] output_dir`` that cannot be a writable directory: one line, exit 2, before training."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from hyper_core.cli import main
from hyper_core.config import dump_config, load_config_dict
from hyper_core.errors import UserError
from hyper_core.testing import tiny_text_config
from hyper_core.testing.processes import hyper_train
from hyper_core.trainer.run import prepare_output_dir


def _config_file(tmp_path: Path, output_dir: Path) -> Path:
    path = tmp_path / "run.toml"
    path.write_text(dump_config(load_config_dict(tiny_text_config(output_dir))))
    return path


def test_an_output_dir_that_is_a_file_exits_2_in_one_line(tmp_path: Path) -> None:
    afile = tmp_path / "afile"
    afile.write_text("x\n")
    proc = hyper_train(["run", str(_config_file(tmp_path, afile))], timeout=120)
    assert proc.returncode == 2, proc.stderr[-3000:]
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert lines == [f"hyper-train: error: $.run.output_dir: {afile} exists and is not a directory"]
    assert afile.read_text() == "x\n"


def test_an_output_dir_that_cannot_be_created_exits_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    target = "/proc/hyper-train-test/out"
    code = main(
        ["run", str(_config_file(tmp_path, tmp_path / "unused")), f"--run.output_dir={target}"]
    )
    err = capsys.readouterr().err
    assert code == 2
    assert err.strip() == (
        f"hyper-train: error: $.run.output_dir: cannot create {target}: No such file or directory"
    )


def test_an_output_dir_under_a_file_is_a_user_error(tmp_path: Path) -> None:
    (tmp_path / "afile").write_text("")
    with pytest.raises(UserError, match=r"\$\.run\.output_dir: cannot create .*Not a directory"):
        prepare_output_dir(tmp_path / "afile" / "out")


def test_an_output_dir_without_write_permission_is_a_user_error(tmp_path: Path) -> None:
    if os.geteuid() == 0:  # root writes anywhere: /proc/self is a directory no one can write
        target = Path("/proc/self")
    else:
        target = tmp_path / "readonly"
        target.mkdir(mode=0o500)
    with pytest.raises(UserError, match=rf"\$\.run\.output_dir: {target} is not writable"):
        prepare_output_dir(target)


def test_a_missing_output_dir_is_created(tmp_path: Path) -> None:
    prepare_output_dir(tmp_path / "a" / "b")
    assert (tmp_path / "a" / "b").is_dir()
