"""What depends on the world size is checked before torchrun starts, and reported once."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from hyper_core.cli import launch as launch_module
from hyper_core.cli import main
from hyper_core.config import load_config_dict
from hyper_core.config.world import check_world
from hyper_core.errors import ConfigError, UserError
from hyper_core.testing import tiny_text_config

REPO = Path(__file__).resolve().parents[2]
TEXT_DEMO = str(REPO / "configs" / "text_demo.toml")


def _config(tmp_path: Path, **sections: dict[str, Any]) -> Any:
    return load_config_dict(tiny_text_config(tmp_path, **sections))


def _ddp(tmp_path: Path, **training: Any) -> Any:
    return _config(tmp_path, parallel={"strategy": "ddp"}, training=training)


def test_batch_sizes_get_values_that_work(tmp_path: Path) -> None:
    config = _ddp(tmp_path, global_batch_size=8, micro_batch_size=8)
    check_world(config, 1)  # one process: fine
    with pytest.raises(ConfigError) as info:
        check_world(config, 2)
    msg = str(info.value)
    assert msg.startswith("$.training.global_batch_size: with 2 ranks (--nproc-per-node 2): ")
    assert "try micro_batch_size 4 (accumulation 1) or global_batch_size 16 (accumulation 1)" in msg
    check_world(_ddp(tmp_path, global_batch_size=16, micro_batch_size=8), 2)


def test_a_global_batch_the_ranks_cannot_split_gets_global_sizes(tmp_path: Path) -> None:
    config = _ddp(tmp_path, global_batch_size=10, micro_batch_size=2)
    expected = r"global_batch_size 8 \(accumulation 1\) or global_batch_size 16 \(accumulation 2\)$"
    with pytest.raises(ConfigError, match=expected):
        check_world(config, 4)


def test_strategy_none_and_the_mesh(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"^\$\.parallel\.strategy: .*'none' runs one process"):
        check_world(_config(tmp_path), 2)
    hsdp = _config(tmp_path, parallel={"strategy": "fsdp2", "dp_replicate": 3})
    expected = r"\$\.parallel\.dp_replicate: .*: 3 does not divide .* 4; try dp_replicate 2 or 4"
    with pytest.raises(ConfigError, match=expected):
        check_world(hsdp, 4)
    parallel = {"strategy": "fsdp2", "dp_replicate": 2, "dp_shard": 4}
    shard = _config(tmp_path, parallel=parallel, training={"global_batch_size": 32})
    with pytest.raises(ConfigError, match=r"\$\.parallel\.dp_shard: .*try dp_shard 2 or -1"):
        check_world(shard, 4)
    check_world(shard, 4, "2")  # 8 ranks: 2 × 4


def test_every_size_of_an_elastic_node_range_is_checked(tmp_path: Path) -> None:
    config = _ddp(tmp_path, global_batch_size=16, micro_batch_size=8)
    check_world(config, 2, "1:1")
    with pytest.raises(ConfigError, match=r"with 4 ranks \(2 nodes of --nnodes 1:3 × "):
        check_world(config, 2, "1:3")
    for bad in ("x", "2:1", "0"):
        with pytest.raises(UserError, match="--nnodes"):
            check_world(config, 2, bad)


def _one_line(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    return err


@pytest.mark.parametrize("dry_run", [True, False])
def test_run_stops_before_launching(
    dry_run: bool, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    def launch(args: Any) -> int:
        raise AssertionError("torchrun started")

    monkeypatch.setattr(launch_module, "launch_torchrun", launch)
    argv = ["run", TEXT_DEMO, "--nproc-per-node", "2", "--parallel.strategy=ddp"]
    argv += ["--training.global_batch_size=8"] + (["--dry-run"] if dry_run else [])
    assert main(argv) == 2
    err = _one_line(capsys)
    assert err.startswith("hyper-train: error: ")
    assert "$.training.global_batch_size" in err
    assert "try micro_batch_size 4 (accumulation 1)" in err


def test_config_validate_takes_the_world_size(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["config", "validate", TEXT_DEMO, "--nproc-per-node", "2"]) == 2
    assert "$.parallel.strategy: with 2 ranks" in _one_line(capsys)
    argv = ["config", "validate", TEXT_DEMO, "--parallel.strategy=ddp"]
    assert main([*argv, "--nproc-per-node", "2"]) == 0
    assert main([*argv, "--nproc-per-node", "4", "--nnodes", "2"]) == 2
    assert "with 8 ranks (--nnodes 2 × --nproc-per-node 4)" in _one_line(capsys)


def test_a_rank_leaves_its_user_error_to_the_launcher(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, value in {"RANK": "1", "LOCAL_RANK": "1", "WORLD_SIZE": "2"}.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv(launch_module.STATUS_DIR_ENV, str(tmp_path))
    assert main(["run", TEXT_DEMO, "--run.plugins=['nosuchplugin']"]) == 2
    assert capsys.readouterr().err == ""
    record = json.loads((tmp_path / "rank-1.json").read_text())
    assert record["user_error"] and "nosuchplugin" in record["error"]


def test_the_launcher_says_a_shared_error_once(capsys: pytest.CaptureFixture[str]) -> None:
    error = "DataError: the training data has 0 usable samples"
    statuses = {
        r: {"rank": r, "local_rank": r, "status": "failed", "error": error, "user_error": True}
        | {"time": float(2 - r)}
        for r in (0, 1)
    }
    assert launch_module.launcher_exit_code(1, statuses, 2) == 2
    err = _one_line(capsys)
    assert err == f"hyper-train: rank 1 (first) failed: {error}\n"


@pytest.mark.parametrize(
    ("script", "expected"),
    [("raise SystemExit(2)", ""), ("import os; os.kill(os.getpid(), 9)", "was killed by SIGKILL")],
)
def test_torchrun_leaves_the_report_to_the_launcher(
    script: str, expected: str, tmp_path: Path
) -> None:
    path = tmp_path / "rank.py"
    path.write_text(script + "\n")
    cmd = [sys.executable, "-m", launch_module.QUIET_TORCHRUN, "--standalone", "--nproc-per-node=1"]
    proc = subprocess.run(
        [*cmd, str(path)], capture_output=True, text=True, timeout=120, check=False
    )
    assert proc.returncode == 1
    assert "Traceback" not in proc.stderr and "exitcode" not in proc.stderr, proc.stderr
    assert expected in proc.stderr


@pytest.mark.parametrize(
    "argv", [["--max-restarts", "1"], ["--nproc-per-node", "2", "--max-restarts", "-1"]]
)
def test_max_restarts_needs_the_launcher(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["run", TEXT_DEMO, *argv]) == 2
    assert "--max-restarts" in _one_line(capsys)
