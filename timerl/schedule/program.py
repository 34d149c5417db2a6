"""The schedule: a tree of loops over temporal dims whose bodies are compute and memory statements.

It is plain data, printed by ``prog.explain()`` and run by the executor.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Union

from timerl.ir.graph import Op
from timerl.symbolic import Dim, Expr


@dataclass(eq=False)
class Compute:
    op: Op


@dataclass(eq=False)
class Free:
    """Release the points of ``op`` whose leading coordinates equal ``prefix`` (all if empty),
    except those whose last prefix coordinate is one of ``pinned`` (still read later)."""

    op: Op
    prefix: tuple[Expr, ...] = ()
    pinned: tuple[Expr, ...] = ()


@dataclass(eq=False)
class Loop:
    dim: Dim
    forward: bool
    body: list[Stmt] = field(default_factory=list)
    until: Op | None = None  # ends the loop after the first point where this bool op holds


Stmt = Union[Compute, Free, Loop]


@dataclass(eq=False)
class Schedule:
    body: list[Stmt]

    def statements(self) -> list[Stmt]:
        out: list[Stmt] = []

        def visit(body: list[Stmt]) -> None:
            for s in body:
                out.append(s)
                if isinstance(s, Loop):
                    visit(s.body)

        visit(self.body)
        return out

    def loops(self) -> list[Loop]:
        return [s for s in self.statements() if isinstance(s, Loop)]

    def dump(self) -> str:
        """The schedule as indented pseudo-code."""
        lines: list[str] = []

        def visit(body: list[Stmt], depth: int) -> None:
            pad = "  " * depth
            for s in body:
                if isinstance(s, Loop):
                    d = s.dim
                    rng = f"0 .. {d.bound.name}-1" if s.forward else f"{d.bound.name}-1 .. 0"
                    extra = f" until {s.until.label}" if s.until is not None else ""
                    lines.append(f"{pad}for {d.name} in {rng}{extra}:")
                    visit(s.body, depth + 1)
                elif isinstance(s, Compute):
                    op = s.op
                    point = ", ".join(d.name for d in op.domain)
                    reads = ", ".join(map(repr, op.inputs))
                    lines.append(f"{pad}{op.label}[{point}] = {op.prim}({reads})")
                else:
                    where = ", ".join(map(str, s.prefix)) if s.prefix else "*"
                    unless = f" unless {s.prefix[-1]} in {list(s.pinned)}" if s.pinned else ""
                    lines.append(f"{pad}free {s.op.label}[{where}]{unless}")

        visit(self.body, 0)
        return "\n".join(lines)
