"""``new-plugin --kind adapter --vision [--tiles]``: a vision-language adapter after the LLaVA
example, or a tile-based one (InternVL) whose vision-encoder methods are the core's defaults
(that they install and pass conformance: the slow test in ``test_new_plugin.py``)."""

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


def test_writes_a_tile_based_adapter_that_overrides_no_vision_method(tmp_path: Path) -> None:
    root = scaffold("demo-vl", "adapter", tmp_path, vision=True, tiles=True)
    assert {p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file()} == EXPECTED
    adapter = (root / "hyper_demo_vl" / "adapter.py").read_text()
    assert "class DemoVlAdapter(HFModelAdapter):" in adapter
    assert 'vision_tile_key = "num_patches"' in adapter
    for method in ("split_vision_inputs", "call_vision_encoder", "inject_vision_outputs"):
        assert f"def {method}" not in adapter, method
    processor = (root / "hyper_demo_vl" / "processor.py").read_text()
    assert 'metadata_keys = ("num_patches",)' in processor
    for rel, text in render("demo-vl", "adapter", vision=True, tiles=True).items():
        assert "${" not in text and "$$" not in text, rel
    assert_generated_code_is_clean(root)


def test_tiles_go_with_a_vision_adapter() -> None:
    with pytest.raises(UserError, match="--tiles goes with --kind adapter --vision"):
        render("demo-vl", "adapter", tiles=True)
