"""The generated reference pages are current and every hook is documented with an example."""

from __future__ import annotations

import pytest

from hyper_core import docgen, hookspecs


@pytest.mark.parametrize("name", sorted(docgen.GENERATED))
def test_generated_page_is_current(name: str) -> None:
    page = docgen.DOCS / name
    assert page.is_file(), f"docs/{name} is missing: run python -m hyper_core.docgen"
    assert page.read_text() == docgen.GENERATED[name](), (
        f"docs/{name} is stale: run python -m hyper_core.docgen"
    )


def test_every_hook_has_docs_and_an_example() -> None:
    names = hookspecs.REGISTRATION_HOOKS + hookspecs.BUILD_STAGES + hookspecs.LIFECYCLE_EVENTS
    page = docgen.render_hooks()
    for name in names:
        assert f"### `{name}(" in page, name
        assert name in docgen.EXAMPLES, f"no example for {name}"
        # An example's code defines (or wraps) the hook it documents.
        assert f"def {name}(" in docgen.EXAMPLES[name], name


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
