"""graphopt stands alone: it imports nothing of timerl outside ``timerl.graphopt`` and
``timerl.errors`` (the compiler and the corpus's timerl family reach it, never the reverse)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import timerl.graphopt
from timerl.errors import GraphError
from timerl.graphopt.corpus import build_corpus

ROOT = Path(timerl.graphopt.__file__).parent
ALLOWED = ("timerl.graphopt", "timerl.errors")


def _timerl_imports(path: Path) -> list[str]:
    names = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.extend(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.append(node.module)
            if node.module == "timerl":
                names.extend(f"timerl.{a.name}" for a in node.names)
    return [n for n in names if n == "timerl" or n.startswith("timerl.")]


def test_graphopt_imports_only_itself_and_errors():
    files = sorted(ROOT.rglob("*.py"))
    assert len(files) > 15
    bad = {
        str(p.relative_to(ROOT)): [n for n in _timerl_imports(p) if not n.startswith(ALLOWED)]
        for p in files
    }
    assert {k: v for k, v in bad.items() if v} == {}


def test_the_check_sees_a_forbidden_import(tmp_path):
    f = tmp_path / "m.py"
    f.write_text("def f():\n    from timerl.ir.graph import Op\n    import timerl.schedule\n")
    assert _timerl_imports(f) == ["timerl.ir.graph", "timerl.schedule"]


def test_timerl_family_without_an_exporter_is_an_error(tmp_path):
    with pytest.raises(GraphError, match="needs a program exporter"):
        build_corpus(tmp_path, quick=True, progress=False, families=["timerl"])
