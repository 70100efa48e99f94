"""No hidden contracts through attributes: no shipped code (the core, the plugins, the adapters,
the documented examples) sets, reads or removes an attribute named by a constant (``setattr(model,
CHECKPOINT_VIEW, ...)``, ``getattr(module, CONTEXT_PARALLEL_ATTR)``, ``x.__dict__[PENDING]``) or
a ``hyper_train*`` attribute on an object it does not own. What crosses components goes through
arguments (the load plan, ``register(..., options=)``, hook keyword arguments)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = ("hyper_core", "plugins", "adapters", "docs/examples")
ATTRIBUTE_CALLS = {"setattr", "getattr", "hasattr", "delattr"}


def _is_contract_name(node: ast.expr) -> bool:
    """An attribute name that is a module constant, or a literal in hyper-train's namespace."""
    if isinstance(node, ast.Name):
        return node.id.isupper() or node.id.lstrip("_").isupper()
    if isinstance(node, ast.Attribute):  # module.CONSTANT
        return node.attr.lstrip("_").isupper()
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value.lstrip("_").startswith("hyper_")
    return False


def _is_foreign_hyper_attribute(node: ast.expr) -> bool:
    """``obj._hyper_x`` / ``obj.hyper_train_x`` on an object other than ``self`` / ``cls``."""
    return (
        isinstance(node, ast.Attribute)
        and node.attr.lstrip("_").startswith("hyper_")
        and not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"))
    )


def contract_attributes(tree: ast.AST) -> list[tuple[int, str]]:
    """``(line, code)`` of each attribute access by constant name in ``tree``, each
    ``hyper_*`` attribute set on an object the code does not own, and each lookup of one in an
    object's ``__dict__``."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign | ast.AugAssign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(_is_foreign_hyper_attribute(t) for t in targets):
                found.append((node.lineno, ast.unparse(node)))
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and isinstance(node.func.value, ast.Attribute)
            and node.func.value.attr == "__dict__"
            and node.args
            and _is_contract_name(node.args[0])
        ):
            found.append((node.lineno, ast.unparse(node)))
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in ATTRIBUTE_CALLS
            and len(node.args) >= 2
            and _is_contract_name(node.args[1])
        ):
            found.append((node.lineno, ast.unparse(node)))
        elif (
            isinstance(node, ast.Subscript)
            and isinstance(node.value, ast.Attribute)
            and node.value.attr == "__dict__"
            and _is_contract_name(node.slice)
        ):
            found.append((node.lineno, ast.unparse(node)))
    return found


def test_no_attribute_contracts_in_shipped_code() -> None:
    bad = []
    for top in SHIPPED:
        for path in sorted((ROOT / top).rglob("*.py")):
            tree = ast.parse(path.read_text(), filename=str(path))
            bad += [
                f"{path.relative_to(ROOT)}:{line}: {code}"
                for line, code in contract_attributes(tree)
            ]
    assert not bad, "attributes used as contracts (pass the value explicitly):\n" + "\n".join(bad)


def test_the_check_sees_each_form_of_the_old_contracts() -> None:
    code = (
        "setattr(model, CHECKPOINT_VIEW, view)\n"
        "cp = getattr(module, varlen.CONTEXT_PARALLEL_ATTR, None)\n"
        "delattr(model, 'hyper_train_after_load')\n"
        "ddp.__dict__[_PENDING] = finish\n"
        "setattr(target, leaf, value)\n"  # a module path being assigned: not a contract
        "getattr(config, 'num_attention_heads', None)\n"
        "module._hyper_checkpoint = policy\n"
        "policy = module.__dict__.get('_hyper_checkpoint', 'none')\n"
        "self._hyper_state = {}\n"  # the object's own attribute: not a contract
    )
    assert sorted(line for line, _ in contract_attributes(ast.parse(code))) == [1, 2, 3, 4, 7, 8]
