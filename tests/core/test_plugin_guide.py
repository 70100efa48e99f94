"""docs/plugin-guide.md stays true: its excerpts are verbatim from the example package, and
the names and commands it relies on exist."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
GUIDE = REPO / "docs" / "plugin-guide.md"
EXAMPLE = REPO / "docs" / "examples" / "hyper-train-llava"

EXCERPT = re.compile(r"<!-- file: (?P<file>\S+) -->\n```\w*\n(?P<code>.*?)```", re.S)


def test_every_excerpt_is_verbatim_from_the_example() -> None:
    excerpts = list(EXCERPT.finditer(GUIDE.read_text()))
    assert len(excerpts) >= 8
    for m in excerpts:
        source = (EXAMPLE / m["file"]).read_text()
        assert m["code"] in source, f"plugin-guide.md excerpt of {m['file']} is stale"


def test_the_kit_names_it_mentions_exist() -> None:
    import hyper_core.testing as kit
    from hyper_core.data.multimodal import tokenize_multimodal
    from hyper_core.testing import pytest_plugin
    from hyper_core.testing.conformance import check_adapter
    from hyper_core.testing.conformance_suite import AdapterConformance

    assert callable(tokenize_multimodal) and callable(check_adapter)
    assert AdapterConformance.__name__ == "AdapterConformance"
    for name in ("run_tiny_training", "isolated_host", "HookRecorder"):
        assert hasattr(kit, name), name
    for fixture in ("tiny_run", "hyper_host", "hook_recorder"):
        assert hasattr(pytest_plugin, fixture), fixture


def test_the_commands_it_shows_exist() -> None:
    from hyper_core.cli.main import build_parser
    from hyper_core.plugins import get_plugin_host

    parser = build_parser(get_plugin_host().registries.commands)
    text = GUIDE.read_text()
    for sub in re.findall(r"^hyper-train ([a-z-]+)", text, re.M):
        args = {"run": ["run", "x.toml"], "new-plugin": ["new-plugin", "x"]}.get(sub, [sub])
        assert parser.parse_args(args).handler, sub
