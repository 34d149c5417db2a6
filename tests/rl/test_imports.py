"""``timerl.rl`` is a library on the public API: it imports ``timerl.api``, the top-level
``timerl`` package, ``timerl.errors``, ``timerl.version``, ``graphopt`` and itself, never the compiler's layers
(what it needs of them, ``timerl.api`` offers)."""

from __future__ import annotations

import ast
from pathlib import Path

RL = Path(__file__).resolve().parents[2] / "timerl" / "rl"
ALLOWED = ("timerl.api", "timerl.errors", "timerl.graphopt", "timerl.rl", "timerl.version")


def _allowed(module: str) -> bool:
    return module == "timerl" or any(
        module == prefix or module.startswith(prefix + ".") for prefix in ALLOWED
    )


def _timerl_imports(path: Path) -> list[tuple[int, str]]:
    """Every ``timerl`` module ``path`` imports, at module level or inside a function."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        else:
            continue
        out.extend((node.lineno, n) for n in names if n.split(".")[0] == "timerl")
    return out


def test_rl_imports_only_the_public_api_errors_graphopt_and_itself():
    files = sorted(RL.rglob("*.py"))
    assert len(files) > 20, f"found only {len(files)} modules under {RL}"
    bad = [
        f"{path.relative_to(RL.parent)}:{line} imports {module}"
        for path in files
        for line, module in _timerl_imports(path)
        if not _allowed(module)
    ]
    assert not bad, "rl reaches past the API:\n" + "\n".join(bad)


def test_the_check_sees_a_forbidden_import(tmp_path):
    """The walk finds imports in functions too, and refuses the compiler's layers."""
    sample = tmp_path / "sample.py"
    sample.write_text(
        "import timerl\nfrom timerl.api.tensor import RecurrentTensor\n"
        "def f():\n    from timerl.ir.build import apply\n    import timerl.runtime.backend\n"
    )
    found = _timerl_imports(sample)
    assert [m for _, m in found] == [
        "timerl",
        "timerl.api.tensor",
        "timerl.ir.build",
        "timerl.runtime.backend",
    ]
    assert [m for _, m in found if not _allowed(m)] == ["timerl.ir.build", "timerl.runtime.backend"]
