"""Passes ask traits and rule tables, never primitive names: outside the registry and the
backends' lowering modules, no code compares an op's primitive with a name (docs/architecture.md,
"Adding a primitive")."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "timerl"

# where primitives are named by design: the registry (definitions and the rule tables beside
# them) and each backend's lowering table
ALLOWED = (
    "timerl/ir/prims/",
    "timerl/runtime/torch_lowering.py",
    "timerl/runtime/jax_lowering.py",
    "timerl/runtime/numpy_backend.py",
)
# files that still compare names, each with the name-free form that replaces the comparison;
# their owners are rewriting them (a file that no longer compares names must leave this list)
PENDING = {
    # fusion moves into a compiler pass: ``traits.tuple_part``
    "timerl/runtime/regions.py": "prims.get(op.prim).traits.tuple_part",
}


def _is_prim(node: ast.AST) -> bool:
    return isinstance(node, ast.Attribute) and node.attr == "prim"


def _names(node: ast.AST, literals: dict[str, bool]) -> bool:
    """Whether ``node`` is a string, a collection of strings, or a module-level name bound to
    one (a set of names), or a dict with string keys (a table of names)."""
    if isinstance(node, ast.Constant):
        return isinstance(node.value, str)
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return bool(node.elts) and all(_names(e, literals) for e in node.elts)
    if isinstance(node, ast.Dict):
        return bool(node.keys) and all(k is not None and _names(k, literals) for k in node.keys)
    if isinstance(node, ast.Call) and getattr(node.func, "id", None) in ("frozenset", "set"):
        return len(node.args) == 1 and _names(node.args[0], literals)
    if isinstance(node, ast.Name):
        return literals.get(node.id, False)
    return False


def name_comparisons(source: str) -> list[int]:
    """Lines where an op's ``.prim`` is compared with a name, tested against a set of names,
    or looked up in a module-level table of names."""
    tree = ast.parse(source)
    literals: dict[str, bool] = {}
    for stmt in tree.body:
        targets = stmt.targets if isinstance(stmt, ast.Assign) else []
        if isinstance(stmt, ast.AnnAssign) and stmt.value is not None:
            targets = [stmt.target]
        value = getattr(stmt, "value", None)
        for t in targets:
            if isinstance(t, ast.Name) and value is not None:
                literals[t.id] = _names(value, literals)
    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            operands = [node.left, *node.comparators]
            if any(_is_prim(o) for o in operands) and any(_names(o, literals) for o in operands):
                lines.append(node.lineno)
        elif isinstance(node, ast.Subscript) and _is_prim(node.slice):
            if _names(node.value, literals):
                lines.append(node.lineno)
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            lookup = node.func.attr == "get" and node.args and _is_prim(node.args[0])
            if lookup and _names(node.func.value, literals):
                lines.append(node.lineno)
    return sorted(lines)


def _found() -> dict[str, list[int]]:
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        if rel.startswith(ALLOWED):
            continue
        lines = name_comparisons(path.read_text())
        if lines:
            out[rel] = lines
    return out


def test_no_pass_compares_primitive_names():
    found = {f: lines for f, lines in _found().items() if f not in PENDING}
    assert not found, (
        "primitive names compared outside the registry (ask Traits or a rule table of "
        f"timerl/ir/prims/ instead): {found}"
    )


def test_the_pending_list_holds_only_files_that_still_compare_names():
    found = _found()
    stale = sorted(f for f in PENDING if f not in found)
    assert not stale, f"these files no longer compare names: drop them from PENDING: {stale}"


def test_the_check_finds_each_form_of_comparison():
    source = """
NAMES = frozenset({"detach", "identity"})
TABLE = {"matmul": 1, "reshape": 2}
a = op.prim == "matmul"
b = "permute" != op.prim
c = op.prim in ("add", "mul")
d = src.prim in NAMES
e = TABLE.get(op.prim)
f = TABLE[op.prim]
g = op.prim == other.prim
h = self.table.get(op.prim)
"""
    assert name_comparisons(source) == [4, 5, 6, 7, 8, 9]
