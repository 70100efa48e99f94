"""The core's layers run one way: no runtime import goes to a higher layer, no cycle between
layers. The order is the table in docs/architecture.md ("Layers"), read here, so the doc and
the check cannot drift apart."""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

import attrs

ROOT = Path(__file__).resolve().parents[2]
CORE = ROOT / "hyper_core"
ARCHITECTURE = ROOT / "docs" / "architecture.md"


@attrs.frozen
class Edge:
    """One runtime import of a core module by another, in different units."""

    source: str  # importing module
    line: int
    target: str  # imported module
    source_unit: str
    target_unit: str

    def __str__(self) -> str:
        return f"{self.source}:{self.line} imports {self.target}"


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def unit_of(module: str) -> str:
    """The layer unit of a core module: its top-level module or package under hyper_core."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def is_module(name: str) -> bool:
    rel = Path(*name.split("."))
    return (ROOT / rel).with_suffix(".py").is_file() or (ROOT / rel / "__init__.py").is_file()


def _type_checking_nodes(tree: ast.AST) -> set[int]:
    """Ids of the nodes in the body of ``if TYPE_CHECKING:`` (type-only imports)."""
    ids: set[int] = set()
    for node in ast.walk(tree):
        if not isinstance(node, ast.If):
            continue
        test = node.test
        name = test.id if isinstance(test, ast.Name) else getattr(test, "attr", None)
        if name == "TYPE_CHECKING":
            for stmt in node.body:
                ids.update(id(n) for n in ast.walk(stmt))
    return ids


def _targets(node: ast.Import | ast.ImportFrom, module: str, is_package: bool) -> Iterator[str]:
    if isinstance(node, ast.Import):
        yield from (alias.name for alias in node.names)
        return
    if node.level:
        package = module.split(".") if is_package else module.split(".")[:-1]
        base = ".".join(package[: len(package) - node.level + 1])
        stem = f"{base}.{node.module}" if node.module else base
    else:
        stem = node.module or ""
    for alias in node.names:
        # `from pkg import sub` imports the submodule `pkg.sub` when there is one.
        child = f"{stem}.{alias.name}"
        yield child if is_module(child) else stem


def runtime_edges(root: Path = CORE) -> list[Edge]:
    """Every runtime import (module level or inside a function) between two units."""
    edges: list[Edge] = []
    for path in sorted(root.rglob("*.py")):
        module = module_name(path)
        tree = ast.parse(path.read_text(), filename=str(path))
        type_only = _type_checking_nodes(tree)
        for node in ast.walk(tree):
            if not isinstance(node, (ast.Import, ast.ImportFrom)) or id(node) in type_only:
                continue
            for target in dict.fromkeys(_targets(node, module, path.name == "__init__.py")):
                if target.split(".")[0] != "hyper_core":
                    continue
                a, b = unit_of(module), unit_of(target)
                if a != b:
                    edges.append(Edge(module, node.lineno, target, a, b))
    return edges


def documented_layers(text: str) -> list[list[str]]:
    """The units of each row of the "Layers" table, lowest layer first."""
    section = text.split("\n## Layers\n", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if re.match(r"\|\s*\d+\s*\|", line)]
    return [re.findall(r"`([\w.]+)`", row.split("|")[2]) for row in rows]


def layer_index() -> dict[str, int]:
    index: dict[str, int] = {}
    for rank, units in enumerate(documented_layers(ARCHITECTURE.read_text())):
        for unit in units:
            assert unit not in index, f"{unit} is in two layers of docs/architecture.md"
            index[unit] = rank
    return index


def units() -> set[str]:
    found = {unit_of(module_name(p)) for p in CORE.rglob("*.py")}
    return found | {unit_of(module_name(p.parent)) for p in CORE.rglob("__init__.py")}


def upward(edges: list[Edge], index: dict[str, int]) -> list[Edge]:
    return [e for e in edges if index[e.target_unit] > index[e.source_unit]]


def cycles(edges: list[Edge]) -> list[list[str]]:
    """The strongly connected components of more than one unit (Tarjan)."""
    graph: dict[str, set[str]] = {}
    for e in edges:
        graph.setdefault(e.source_unit, set()).add(e.target_unit)
        graph.setdefault(e.target_unit, set())
    order: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        order[v] = low[v] = len(order)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in order:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], order[w])
        if low[v] == order[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in order:
            visit(v)
    return found


def test_every_unit_has_a_documented_layer() -> None:
    missing = sorted(units() - set(layer_index()))
    assert not missing, f"place these in the Layers table of docs/architecture.md: {missing}"


def test_no_runtime_import_goes_up_a_layer() -> None:
    index = layer_index()
    bad = upward(runtime_edges(), index)
    assert not bad, f"{len(bad)} upward runtime imports:\n" + "\n".join(
        f"  {e}  ({e.source_unit}: layer {index[e.source_unit] + 1} -> "
        f"{e.target_unit}: layer {index[e.target_unit] + 1})"
        for e in bad
    )


def test_no_cycle_between_units() -> None:
    edges = runtime_edges()
    found = cycles(edges)
    lines = []
    for component in found:
        members = set(component)
        lines.append(" <-> ".join(component))
        lines += [f"  {e}" for e in edges if e.source_unit in members and e.target_unit in members]
    assert not found, "runtime import cycles between units:\n" + "\n".join(lines)


def test_the_checks_see_upward_imports_and_cycles() -> None:
    # Imports in functions count, relative ones resolve to submodules, type-only ones do not.
    code = (
        "from typing import TYPE_CHECKING\n"
        "from ..config import schema\n"
        "if TYPE_CHECKING:\n    from ..trainer import trainer\n"
        "def f():\n    from ..errors import ConfigError\n    from . import chat\n"
    )
    tree = ast.parse(code)
    type_only = _type_checking_nodes(tree)
    found = [
        target
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and node.level and id(node) not in type_only
        for target in _targets(node, "hyper_core.data.jsonl", is_package=False)
    ]
    assert sorted(found) == [
        "hyper_core.config.schema",
        "hyper_core.data.chat",
        "hyper_core.errors",
    ]
    edges = [Edge("hyper_core.a", 1, "hyper_core.b", "a", "b")]
    edges.append(Edge("hyper_core.b", 2, "hyper_core.a", "b", "a"))
    assert upward(edges, {"a": 0, "b": 1}) == edges[:1]
    assert cycles(edges) == [["a", "b"]]
    assert cycles(edges[:1]) == []
