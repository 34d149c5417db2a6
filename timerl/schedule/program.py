"""The schedule: a tree of loops over temporal dims whose bodies are compute and memory statements.

It is plain data, printed by ``prog.explain()`` and run by the executor.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Union

from timerl.ir.graph import Op
from timerl.symbolic import Bound, Dim, Expr


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
class SwapOut:
    """Write the blocks of block store ``op`` at outer point ``prefix`` to disk and release
    them: their next reader is far (placed only under a memory budget). With ``points``, the
    points of a point store under ``prefix`` instead (``memory/point_swap.py``)."""

    op: Op
    prefix: tuple[Expr, ...] = ()
    points: bool = False


@dataclass(eq=False)
class SwapIn:
    """Read back what a ``SwapOut`` wrote under ``prefix``, before its next reader (nothing
    where nothing under it was written)."""

    op: Op
    prefix: tuple[Expr, ...] = ()
    points: bool = False


@dataclass(eq=False)
class Start:
    """Begin a host call that can run in the background (its op's ``begin`` attribute, e.g. an
    env step sent to remote workers); the op's ``Compute``, later in the same body, waits for
    it. The statements between do not depend on it (``schedule/overlap.py``)."""

    op: Op


@dataclass(eq=False)
class Loop:
    dim: Dim
    forward: bool
    body: list[Stmt] = field(default_factory=list)
    until: Op | None = None  # ends the loop after the first point where this bool op holds


Stmt = Union[Compute, Free, Loop, SwapOut, SwapIn, Start]


def reads(stmt: Stmt, ids: set[int]) -> bool:
    """Whether ``stmt`` (a loop: any statement of its body) computes an op reading one of
    ``ids``; memory statements read nothing."""
    if isinstance(stmt, (Compute, Start)):
        return any(e.src.id in ids for e in stmt.op.inputs)
    if isinstance(stmt, Loop):
        return any(reads(x, ids) for x in stmt.body)
    return False


def idle_gaps(body: list[Stmt], at: int, op_id: int) -> list[tuple[int, int]]:
    """Where the value of ``op_id``, made by the statement at ``at`` of ``body`` (a loop
    computing it, or its own), waits unread: each ``(a, b)`` of consecutive uses there (that
    statement, then the statements reading it) with statements between them."""
    uses = [at] + [k for k in range(at + 1, len(body)) if reads(body[k], {op_id})]
    return [(a, b) for a, b in zip(uses, uses[1:], strict=False) if b - a > 1]


Position = tuple[int, ...]  # a statement's index in each body from the top level down


def rewrite(
    body: list[Stmt], edit: Callable[[Stmt, Position], Sequence[Stmt] | None], at: Position = ()
) -> list[Stmt]:
    """A new body in which each statement stands replaced by ``edit(stmt, position)`` (None:
    kept). Loops among what stands are rebuilt around their bodies rewritten the same way, at
    the position of the statement they replace. Every pass that edits the tree goes through
    this: the schedule is a value, and a pass builds a new one rather than mutate a shared one."""
    out: list[Stmt] = []
    for k, s in enumerate(body):
        here = (*at, k)
        edited = edit(s, here)
        for t in (s,) if edited is None else edited:
            out.append(replace(t, body=rewrite(t.body, edit, here)) if isinstance(t, Loop) else t)
    return out


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

    def outer_loop(self) -> Loop | None:
        """The one forward top-level loop over the outermost dim, which iteration hooks and
        resuming drive (a training iteration); None where there is not exactly one."""
        loops = [s for s in self.body if isinstance(s, Loop)]
        if not loops:
            return None
        dim = min((s.dim for s in loops), key=lambda d: d.uid)
        loops = [s for s in loops if s.dim is dim]
        return loops[0] if len(loops) == 1 and loops[0].forward else None

    def ragged_lengths(self) -> dict[Dim, list[tuple[Bound, tuple[Dim, ...]]]]:
        """Per dim, the lengths a loop ended by ``until`` sets at each of its points (with the
        dims they are kept by): ``done[i, t]`` sets ``T`` once per ``i``. A run takes the
        recorded ``T`` again at each point of a later loop over ``i`` (a loop over ``t``, or
        an op reading ``T``, the scheduler placed in another loop over ``i`` than the stop's)."""
        out: dict[Dim, list[tuple[Bound, tuple[Dim, ...]]]] = {}
        for loop in self.loops():
            if loop.until is None:
                continue
            others = tuple(d for d in loop.until.domain if d is not loop.dim)
            for d in others:
                if (loop.dim.bound, others) not in out.setdefault(d, []):
                    out[d].append((loop.dim.bound, others))
        return out

    def summary(self, names: int = 10) -> str:
        """The schedule's shape: each loop, and for each run of statements between loops how
        many ops it computes, which of the user's tensors they are, and how many frees.

        Short enough to read for a whole training program; ``dump`` has every statement.
        """
        lines: list[str] = []

        def flush(run: list[Stmt], pad: str) -> None:
            ops = [s.op for s in run if isinstance(s, Compute)]
            frees = sum(1 for s in run if isinstance(s, Free))
            if not ops and not frees:
                return
            user = list(dict.fromkeys(o.name for o in ops if o.name and "#" not in o.name))
            shown = ", ".join(user[:names]) + (
                f", ... ({len(user) - names} more)" if len(user) > names else ""
            )
            what = f": {shown}" if shown else ""
            lines.append(f"{pad}{len(ops)} ops, {frees} frees{what}")

        def visit(body: list[Stmt], depth: int) -> None:
            pad = "  " * depth
            run: list[Stmt] = []
            for s in body:
                if isinstance(s, Loop):
                    flush(run, pad)
                    run = []
                    lines.append(f"{pad}{_loop_header(s)}")
                    visit(s.body, depth + 1)
                else:
                    run.append(s)
            flush(run, pad)

        visit(self.body, 0)
        return "\n".join(lines)

    def dump(self) -> str:
        """The schedule as indented pseudo-code."""
        lines: list[str] = []

        def visit(body: list[Stmt], depth: int) -> None:
            pad = "  " * depth
            for s in body:
                if isinstance(s, Loop):
                    lines.append(f"{pad}{_loop_header(s)}")
                    visit(s.body, depth + 1)
                elif isinstance(s, Compute):
                    op = s.op
                    point = ", ".join(d.name for d in op.domain)
                    reads = ", ".join(map(repr, op.inputs))
                    lines.append(f"{pad}{op.label}[{point}] = {op.prim}({reads})")
                elif isinstance(s, Start):
                    reads = ", ".join(map(repr, s.op.inputs))
                    lines.append(f"{pad}start {s.op.label}({reads}) (runs while the next compute)")
                elif isinstance(s, (SwapOut, SwapIn)):
                    verb = "swap out" if isinstance(s, SwapOut) else "swap in"
                    where = ", ".join(map(str, s.prefix)) if s.prefix else "*"
                    lines.append(f"{pad}{verb} {s.op.label}[{where}]")
                else:
                    where = ", ".join(map(str, s.prefix)) if s.prefix else "*"
                    unless = f" unless {s.prefix[-1]} in {list(s.pinned)}" if s.pinned else ""
                    lines.append(f"{pad}free {s.op.label}[{where}]{unless}")

        visit(self.body, 0)
        return "\n".join(lines)


def _loop_header(loop: Loop) -> str:
    d = loop.dim
    rng = f"0 .. {d.bound.name}-1" if loop.forward else f"{d.bound.name}-1 .. 0"
    extra = f" until {loop.until.label}" if loop.until is not None else ""
    return f"for {d.name} in {rng}{extra}:"
