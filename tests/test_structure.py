"""The shape of the code a newcomer reads: files of a readable size, no environment read
inside the compiler, and docs that are reference, not diaries (docs/architecture.md)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "timerl"
MAX_LINES = 800  # a module longer than this has seams to split along
MAX_DOC_LINES = 600
# the layers that decide what a program computes and how its memory goes: what they do must
# follow from the program and its options alone
NO_ENVIRONMENT = ("symbolic", "ir", "schedule", "memory", "compiler")


def test_no_module_is_longer_than_it_can_be_read():
    long = {
        str(p.relative_to(ROOT)): n
        for p in PACKAGE.rglob("*.py")
        if (n := len(p.read_text().splitlines())) > MAX_LINES
    }
    assert not long, f"modules over {MAX_LINES} lines: {long}"


def _reads_environment(tree: ast.AST) -> list[int]:
    lines = []
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Attribute)
            and node.attr in ("environ", "getenv", "putenv")
            and isinstance(node.value, ast.Name)
            and node.value.id == "os"
        ):
            lines.append(node.lineno)
    return lines


def test_the_compiler_reads_no_environment_variables():
    found = {}
    for layer in NO_ENVIRONMENT:
        for p in (PACKAGE / layer).rglob("*.py"):
            lines = _reads_environment(ast.parse(p.read_text()))
            if lines:
                found[str(p.relative_to(ROOT))] = lines
    assert not found, f"environment reads (pass options instead): {found}"


def test_docs_are_reference_sized():
    long = {
        str(p.relative_to(ROOT)): n
        for p in [*(ROOT / "docs").glob("*.md"), ROOT / "README.md", ROOT / "CHANGELOG.md"]
        if (n := len(p.read_text().splitlines())) > MAX_DOC_LINES
    }
    assert not long, f"docs over {MAX_DOC_LINES} lines: {long}"
