"""A checkpoint that is big for this machine (1.5 GB of fp32 safetensors in several files):
with fsdp2 each rank's memory grows by about its share of the weights, never the whole, when
it loads the checkpoint and when it exports the model again."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from dist_helpers import vl_available, write_toml

from hyper_core.testing import load_probe

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not vl_available(), reason="hyper-train-qwen-vl not installed"),
]
SIZE = 1_500_000_000


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, int]:
    path = tmp_path_factory.mktemp("big") / "hf"
    size = load_probe.write_random_checkpoint(path, SIZE, max_shard_size="400MB")
    assert size >= SIZE
    assert len(list(path.glob("*.safetensors"))) >= 4
    assert (path / "model.safetensors.index.json").is_file()
    return path, size


def _probe(checkpoint: Path, tmp_path: Path, nproc: int, *flags: str) -> dict[str, Any]:
    raw = load_probe.run_config(load_probe.model_section(checkpoint), tmp_path / "run")
    config = write_toml(raw, tmp_path / "run.toml")
    return load_probe.launch(config, tmp_path / "probe.json", nproc, *flags)


@pytest.mark.parametrize(("ranks", "bound"), [(2, 0.6), (4, 0.35)])
def test_each_rank_holds_only_its_share_and_the_weights_are_exact(
    checkpoint: tuple[Path, int], tmp_path: Path, ranks: int, bound: float
) -> None:
    path, size = checkpoint
    flags = ["--compare"] + (["--export", str(tmp_path / "hf")] if ranks == 2 else [])
    result = _probe(path, tmp_path, ranks, *flags)
    assert result["path"] == "sharded" and result["ranks"] == ranks
    assert result["max_abs_diff"] == 0.0  # the gathered weights equal from_pretrained's
    ratios = [peak / size for peak in result["peak_rss_bytes"]]
    print(f"{ranks} ranks: peak RSS / checkpoint = {[round(r, 3) for r in ratios]}")
    assert max(ratios) <= bound, ratios
    assert min(ratios) >= 0.9 / ranks  # the measurement sees the shard itself
    if ranks == 2:
        _check_export(path, tmp_path / "hf", result["export_peak_rss_bytes"], size)


def _check_export(source: Path, out: Path, peaks: list[int], size: int) -> None:
    """The export of the loaded model (200 MB shards): every process's peak RSS rise under
    0.6 of the checkpoint, and the very tensors of the source under its names."""
    from safetensors import safe_open

    ratios = [peak / size for peak in peaks]
    print(f"export on 2 ranks: peak RSS rise / checkpoint = {[round(r, 3) for r in ratios]}")
    assert max(ratios) <= 0.6, ratios
    assert len(list(out.glob("model-*-of-*.safetensors"))) >= 7
    source_map = json.loads((source / "model.safetensors.index.json").read_text())["weight_map"]
    export_map = json.loads((out / "model.safetensors.index.json").read_text())["weight_map"]
    assert export_map.keys() == source_map.keys()
    for shard in sorted(set(export_map.values())):
        with safe_open(str(out / shard), "pt") as ours:
            for name in ours.keys():
                with safe_open(str(source / source_map[name]), "pt") as theirs:
                    assert ours.get_tensor(name).equal(theirs.get_tensor(name)), name


def test_the_rank0_path_holds_the_whole_model(checkpoint: tuple[Path, int], tmp_path: Path) -> None:
    """The measurement can fail: rank 0's broadcast path reads the whole checkpoint."""
    path, size = checkpoint
    result = _probe(path, tmp_path, 2, "--rank0")
    assert result["path"] == "rank0"
    assert result["peak_rss_bytes"][0] >= 1.0 * size
