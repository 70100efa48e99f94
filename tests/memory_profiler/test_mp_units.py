"""Unit tests: config section, sizes, the saved-tensor meter, step peaks, sharding arithmetic."""

from __future__ import annotations

import json
import mmap
import subprocess
import sys
import time

import pytest
import torch

from hyper_core.config import load_config_dict
from hyper_core.errors import ConfigError
from hyper_memory_profiler.activations import SavedTensorMeter
from hyper_memory_profiler.config import MemoryProfilerConfig, parse_steps
from hyper_memory_profiler.estimate import local_rows
from hyper_memory_profiler.peaks import StepPeaks
from hyper_memory_profiler.units import parse_size

BASE = {
    "model": {"adapter": "hf_causal_lm", "config": "tiny-qwen2"},
    "data": {"train": "x.jsonl"},
    "training": {"steps": 1, "global_batch_size": 2, "micro_batch_size": 1, "lr": 1e-3},
}


def _sections() -> dict[str, object]:
    from hyper_core.plugins.manager import PluginHost

    return PluginHost().registries.config_sections


def test_section_defaults_and_validation() -> None:
    sections = _sections()
    cfg = load_config_dict(BASE, sections=sections).section("memory_profiler")
    assert cfg == MemoryProfilerConfig()
    assert cfg.enabled is False and cfg.output_dir == "memory" and cfg.max_entries == 100_000
    with pytest.raises(ConfigError, match=r"\$\.memory_profiler\.steps: .*1-based"):
        load_config_dict({**BASE, "memory_profiler": {"steps": [0, 2]}}, sections=sections)
    with pytest.raises(ConfigError, match=r"\$\.memory_profiler\.steps"):
        load_config_dict({**BASE, "memory_profiler": {"steps": "3-1"}}, sections=sections)
    with pytest.raises(ConfigError, match=r"\$\.memory_profiler\.max_entrys.*max_entries"):
        load_config_dict({**BASE, "memory_profiler": {"max_entrys": 5}}, sections=sections)
    with pytest.raises(ConfigError, match=r"\$\.memory_profiler\.enabled: expected bool"):
        load_config_dict({**BASE, "memory_profiler": {"enabled": "yes"}}, sections=sections)


def test_step_selection() -> None:
    s = parse_steps([1, 3])
    assert (1 in s, 2 in s, 3 in s, 4 in s) == (True, False, True, False)
    assert (s.first, s.last) == (1, 3)
    r = parse_steps("2..4")
    assert [n for n in range(1, 7) if n in r] == [2, 3, 4]
    assert parse_steps(" 5 - 5 ").last == 5
    a = parse_steps("all")
    assert a.last is None and 10_000 in a
    for bad in ("1,2", "", "x-3"):
        with pytest.raises(ValueError):
            parse_steps(bad)


def test_parse_size() -> None:
    assert parse_size("80GiB") == 80 * 2**30
    assert parse_size("141GB") == 141 * 10**9
    assert parse_size("1.5 MiB") == 3 * 2**19
    assert parse_size("4096") == 4096
    with pytest.raises(ValueError):
        parse_size("80 gigs")


def test_fsdp_chunk_rows() -> None:
    """torch.chunk semantics: ranks get ceil(d0/n) rows while they last."""
    assert [local_rows(10, 4, r) for r in range(4)] == [3, 3, 3, 1]
    assert [local_rows(2, 4, r) for r in range(4)] == [1, 1, 0, 0]
    assert local_rows(7, 1) == 7
    for d0, n in ((10, 4), (2, 4), (152064, 8), (3, 2)):
        chunks = [c.shape[0] for c in torch.chunk(torch.empty(d0), n)]
        chunks += [0] * (n - len(chunks))
        assert [local_rows(d0, n, r) for r in range(n)] == chunks


def test_meter_counts_storages_once_and_skips_parameters() -> None:
    lin = torch.nn.Linear(64, 64, bias=False)
    x = torch.randn(32, 64, requires_grad=True)
    meter = SavedTensorMeter()
    meter.start()
    h = lin(x)  # saves x (8 KiB) and the weight (a parameter: skipped)
    y = torch.exp(h)  # saves its output (8 KiB)
    a, b = y.split(32, dim=1)  # views of one storage
    z = (a * b).sum()  # saves both views: one storage, already counted
    out = meter.stop()
    assert not meter.active
    assert out["activations"] == 2 * 32 * 64 * 4
    assert out["param_copies"] == 0
    assert out["saved_tensors"] >= 4
    z.backward()  # the graph still works: nothing was altered
    assert x.grad is not None and x.grad.shape == x.shape


def test_meter_buckets_autocast_weight_copies() -> None:
    lin = torch.nn.Linear(64, 128, bias=False)
    x = torch.randn(16, 64, requires_grad=True)
    meter = SavedTensorMeter()
    meter.start()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        lin(x).float().sum().backward()
    out = meter.stop()
    assert out["param_copies"] == 64 * 128 * 2  # the bf16 weight copy
    assert out["activations"] == 16 * 64 * 2  # the bf16 input copy


def test_meter_chains_outer_hooks() -> None:
    calls = {"pack": 0, "unpack": 0}

    def pack(t: torch.Tensor) -> tuple[str, torch.Tensor]:
        calls["pack"] += 1
        return ("wrapped", t)

    def unpack(p: tuple[str, torch.Tensor]) -> torch.Tensor:
        calls["unpack"] += 1
        return p[1]

    x = torch.randn(8, 8, requires_grad=True)
    with torch.autograd.graph.saved_tensors_hooks(pack, unpack):
        meter = SavedTensorMeter()
        meter.start()
        y = torch.exp(x).sum()
        out = meter.stop()
    y.backward()
    assert out["activations"] == 8 * 8 * 4
    assert calls["pack"] == 1 and calls["unpack"] == 1
    assert torch.allclose(x.grad, torch.exp(x))


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="RSS sampling needs /proc")
def test_cpu_step_peak_sees_a_short_allocation() -> None:
    peaks = StepPeaks(torch.device("cpu"), interval_ms=1.0)
    assert "background thread" in peaks.method
    peaks.start()
    try:
        peaks.begin()
        # 64 MiB of fresh pages (an anonymous map): a malloc'd block could reuse pages the
        # process already holds from earlier tests, and then RSS would not rise at all.
        block = mmap.mmap(-1, 64 * 2**20)
        for offset in range(0, len(block), mmap.PAGESIZE):
            block[offset] = 1
        time.sleep(0.05)
        block.close()
        time.sleep(0.01)
        result = peaks.end()
    finally:
        peaks.close()
    assert result["delta"] >= 48 * 2**20
    assert result["peak"] >= result["start"] + result["delta"] - 1


def test_plugin_module_imports_no_torch() -> None:
    code = (
        "import sys, hyper_memory_profiler.plugin, hyper_memory_profiler.config, "
        "hyper_memory_profiler.report, hyper_memory_profiler.cli; "
        "bad = [m for m in ('torch', 'transformers') if m in sys.modules]; "
        "assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_listed_by_plugins_json() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "hyper_core", "plugins", "--json"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    record = next(r for r in json.loads(out) if r["name"] == "memory_profiler")
    assert record["status"] == "loaded"
    assert record["distribution"] == "hyper-train-memory-profiler"
    assert record["registers"] == {"config section": ["memory_profiler"], "command": ["memory"]}
    assert "build_callbacks" in record["hooks"]  # its per-run object has the events


def test_the_reason_the_data_was_not_read_is_cut_at_a_word(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import hyper_core.trainer.data_stats
    from hyper_core.errors import UserError
    from hyper_memory_profiler.cli import REASON_CHARS, label_fraction_of_data

    words = ["$.model:", *(f"word{i:02d}" for i in range(40))]

    def unreadable(*args: object, **kwargs: object) -> None:
        raise UserError(" ".join(words) + "\nsecond line")

    monkeypatch.setattr(hyper_core.trainer.data_stats, "data_stats", unreadable)
    _, source = label_fraction_of_data(None, None)
    reason = source.removeprefix("default; the data was not read: ")
    assert len(reason) <= REASON_CHARS and reason.endswith(" ...")
    kept = reason.removesuffix(" ...").split(" ")
    assert kept == words[: len(kept)]  # whole words, in order
