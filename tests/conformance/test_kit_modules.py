"""The conformance kit's modules import one way: the fixture class and the checks' helper modules
never import the suite that collects the checks (no import circle, even for annotations)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import hyper_core.testing as testing
from hyper_core.testing import conformance, conformance_fixture, conformance_suite

KIT = Path(testing.__file__).parent


def _relative_imports(path: Path) -> set[str]:
    """The modules of ``hyper_core.testing`` that ``path`` imports, anywhere in it."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level == 1:
            if node.module:
                names.add(node.module)
            else:
                names.update(alias.name for alias in node.names)
    return names


@pytest.mark.parametrize(
    "module", ["conformance_fixture", "conformance_inference", "conformance_tokens"]
)
def test_the_fixture_and_the_check_modules_do_not_import_the_suite(module: str) -> None:
    assert "conformance" not in _relative_imports(KIT / f"{module}.py")


def test_the_fixture_class_is_one_class_importable_where_it_was() -> None:
    assert conformance.AdapterUnderTest is conformance_fixture.AdapterUnderTest
    assert "AdapterUnderTest" in conformance.__all__
    assert conformance_suite.AdapterUnderTest is conformance_fixture.AdapterUnderTest
