"""The generated reference pages are current and every hook is documented with an example."""

from __future__ import annotations

from pathlib import Path

import pytest

from hyper_core import docgen, hookspecs


@pytest.mark.parametrize("name", sorted(docgen.GENERATED))
def test_generated_page_is_current(name: str) -> None:
    page = docgen.DOCS / name
    assert page.is_file(), f"docs/{name} is missing: run python -m hyper_core.docgen"
    assert page.read_text() == docgen.GENERATED[name](), (
        f"docs/{name} is stale: run python -m hyper_core.docgen"
    )


def test_every_hook_has_docs_and_an_example_in_its_docstring() -> None:
    page = docgen.render_hooks()
    for name in docgen.ALL_HOOKS:
        assert f"### `{name}(" in page, name
        doc = getattr(hookspecs, name).__doc__ or ""
        assert "Example::" in doc, f"{name}'s docstring has no example"
        # An example's code defines (or wraps) the hook it documents.
        assert f"def {name}(" in docgen.EXAMPLES[name], name


def test_docgen_holds_no_example_of_its_own() -> None:
    """The examples are written once, in the hookspec docstrings; docgen only renders them."""
    source = Path(docgen.__file__).read_text()
    for name in docgen.ALL_HOOKS:
        assert f"def {name}(" not in source, name


def test_every_config_key_has_help() -> None:
    import attrs

    from hyper_core.config import schema

    fields = attrs.fields_dict(schema.Config)
    for section in schema.CORE_SECTIONS:
        cls = fields[section].type
        if isinstance(cls, str):
            cls = getattr(schema, cls)
        for field in attrs.fields(cls):
            if field.metadata.get("toml") is not False:
                assert field.metadata.get("help"), f"[{section}] {field.name} has no help"
