"""Where ``hyper-train new-plugin`` is documented, every one of its options is."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest

from hyper_core.cli.main import build_parser
from hyper_core.plugins import get_plugin_host
from hyper_core.scaffold import render

REPO = Path(__file__).resolve().parents[2]


def new_plugin_flags() -> set[str]:
    """The long options of ``hyper-train new-plugin`` (not the global ones), from the parser."""
    parser = build_parser(get_plugin_host().registries.commands)
    subcommands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    sub = subcommands.choices["new-plugin"]
    flags = {s for a in sub._actions for s in a.option_strings if s.startswith("--")}
    return flags - {s for a in parser._actions for s in a.option_strings}


def test_the_parser_has_vision() -> None:
    assert {"--kind", "--vision", "--out"} <= new_plugin_flags()


@pytest.mark.parametrize("doc", ["README.md", "docs/plugin-guide.md"])
def test_each_usage_line_names_every_option(doc: str) -> None:
    text = (REPO / doc).read_text(encoding="utf-8")
    usages = re.findall(r"hyper-train new-plugin [^`\n]*", text)
    assert usages, doc
    described = " ".join(usages)
    if doc == "docs/plugin-guide.md":  # §1 shows one command, then the text names the rest
        described += text.split("## 1.", 1)[1].split("\n## ", 1)[0]
    missing = sorted(f for f in new_plugin_flags() if f not in described)
    assert not missing, (doc, missing)


def test_the_text_adapter_template_points_to_vision() -> None:
    adapter = render("demo", "adapter")["hyper_demo/adapter.py"]
    docstring = adapter.split('"""', 2)[1]
    assert "--kind adapter" in docstring and "--vision" in docstring
