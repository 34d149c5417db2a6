"""The package's layering (docs/architecture.md): imports point one way, with no cycles."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import networkx as nx

ROOT = Path(__file__).resolve().parents[1] / "timerl"
# a module may import from its own layer and the layers before it
LAYERS = [
    "errors",
    "symbolic",
    "ir",
    "schedule",
    "memory",
    "compiler",
    "runtime",
    "api",
    "rl",
    "cli",
]
TOP = {"bench_cli": "cli", "cli": "cli", "__init__": "cli", "version": "errors"}


def _modules() -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for path in ROOT.rglob("*.py"):
        parts = path.relative_to(ROOT.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        imports: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                if node.module.startswith("timerl"):
                    imports.add(node.module)
            elif isinstance(node, ast.Import):
                imports.update(a.name for a in node.names if a.name.startswith("timerl"))
        out[name] = imports
    return out


def _layer(module: str) -> str:
    parts = module.split(".")
    if len(parts) == 1:
        return "cli"
    return TOP.get(parts[1], parts[1])


def test_no_import_cycles():
    graph = nx.DiGraph()
    for mod, imports in _modules().items():
        for imp in imports:
            if imp != mod and imp != "timerl":
                graph.add_edge(mod, imp)
    cycles = [c for c in nx.simple_cycles(graph) if len(c) > 1]
    assert not cycles, f"import cycles: {cycles[:5]}"


def test_layers_import_only_earlier_layers():
    bad = []
    for mod, imports in _modules().items():
        layer = _layer(mod)
        for imp in imports:
            target = _layer(imp)
            if layer == "graphopt":
                if target not in ("graphopt", "errors"):
                    bad.append(f"{mod} -> {imp} (graphopt stands alone)")
            elif target == "graphopt":
                if LAYERS.index(layer) < LAYERS.index("schedule"):
                    bad.append(f"{mod} -> {imp}")
            elif LAYERS.index(target) > LAYERS.index(layer):
                bad.append(f"{mod} -> {imp}")
    assert not bad, "imports against the layering:\n" + "\n".join(bad)


def test_public_names_load_lazily_and_all_of_them_resolve():
    """``import timerl.graphopt`` stays light (graphopt stands alone), and every name of
    ``timerl.__all__`` still resolves."""
    code = (
        "import sys, timerl.graphopt.cli; "
        "print(any(m.startswith(('timerl.api', 'timerl.compiler')) for m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False", out.stderr
    import timerl

    for name in timerl.__all__:
        assert getattr(timerl, name) is not None, name
    assert sorted(timerl.__all__) == sorted(set(timerl.__all__))
