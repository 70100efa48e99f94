"""``HYPER_TRAIN_PLUGINS`` leaves installed plugins out: a name it has that no plugin has is a
warning, and a component of a left-out plugin is not answered with ``pip install``."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from hyper_core.cli import main
from hyper_core.errors import PluginError
from hyper_core.plugins.manager import PluginHost

REPO = Path(__file__).resolve().parents[2]


def test_an_unknown_name_warns_with_the_installed_ones(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("HYPER_TRAIN_PLUGINS", "kimi_k26,qwen-vl")
    with caplog.at_level(logging.WARNING, logger="hyper_train.plugins"):
        PluginHost()
    [record] = caplog.records
    assert record.getMessage().startswith("HYPER_TRAIN_PLUGINS names 'qwen-vl': ")
    assert "installed: " in record.getMessage() and "qwen_vl" in record.getMessage()


def test_a_known_name_or_distribution_does_not_warn(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("HYPER_TRAIN_PLUGINS", "qwen_vl,hyper-train-kimi-k26")
    with caplog.at_level(logging.WARNING, logger="hyper_train.plugins"):
        PluginHost()
    assert not caplog.records


def test_a_filtered_out_adapter_is_not_to_be_pip_installed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("HYPER_TRAIN_PLUGINS", "kimi_k26")
    with pytest.raises(PluginError) as info:
        PluginHost().registries.model_adapters.get("qwen2_5_vl")
    msg = str(info.value)
    assert "pip install" not in msg
    assert msg.endswith(
        "it is provided by hyper-train-qwen-vl, which is installed but disabled by "
        "HYPER_TRAIN_PLUGINS='kimi_k26'"
    )
    # Not installed at all (no entry points seen): the pip hint stays.
    with pytest.raises(PluginError, match="pip install hyper-train-qwen-vl"):
        PluginHost(entry_points=False).registries.model_adapters.get("qwen2_5_vl")


def test_a_required_plugin_left_out_says_so(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("HYPER_TRAIN_PLUGINS", "")
    argv = ["run", str(REPO / "configs" / "text_demo.toml"), "--dry-run"]
    assert main([*argv, "--run.plugins=['qwen_vl']"]) == 2
    err = capsys.readouterr().err
    assert err == (
        "hyper-train: error: $.run.plugins: plugin 'qwen_vl' is installed but disabled by "
        "HYPER_TRAIN_PLUGINS=''\n"
    )


def test_a_filtered_out_plugins_section_is_not_to_be_pip_installed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = tmp_path / "c.toml"
    cfg.write_text((REPO / "configs" / "text_demo.toml").read_text() + "\n[memory_profiler]\n")
    monkeypatch.setenv("HYPER_TRAIN_PLUGINS", "kimi_k26")
    assert main(["config", "validate", str(cfg)]) == 2
    err = capsys.readouterr().err
    assert "$.memory_profiler: section of plugin hyper-train-memory-profiler, which is " in err
    assert "installed but disabled by HYPER_TRAIN_PLUGINS='kimi_k26'" in err
    assert "pip install" not in err
