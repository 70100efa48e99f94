"""``new-plugin --kind adapter --vision``: a vision-language adapter after the LLaVA example
(that it installs and passes conformance: the slow test in ``test_new_plugin.py``)."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_new_plugin import assert_generated_code_is_clean

from hyper_core.errors import UserError
from hyper_core.scaffold import render, scaffold

EXPECTED = {
    "pyproject.toml",
    "README.md",
    "hyper_demo_vl/__init__.py",
    "hyper_demo_vl/plugin.py",
    "hyper_demo_vl/adapter.py",
    "hyper_demo_vl/processor.py",
    "hyper_demo_vl/tokens.py",
    "tests/test_demo_vl.py",
}


def test_writes_a_vision_adapter(tmp_path: Path) -> None:
    root = scaffold("demo-vl", "adapter", tmp_path, vision=True)
    assert {p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file()} == EXPECTED
    adapter = (root / "hyper_demo_vl" / "adapter.py").read_text()
    assert "class DemoVlAdapter(HFModelAdapter):" in adapter
    assert 'vision_module = "model.vision_tower"' in adapter
    for rel, text in render("demo-vl", "adapter", vision=True).items():
        assert "${" not in text and "$$" not in text, rel
    assert_generated_code_is_clean(root)


def test_vision_goes_with_the_adapter_kind() -> None:
    with pytest.raises(UserError, match="--vision goes with --kind adapter"):
        render("demo-vl", "plugin", vision=True)
