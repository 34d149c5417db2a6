"""Domain conditions: compute each op only at the points some reader needs.

A branch of a piecewise definition (``ret[True] = r + g * ret[t + 1]`` after
``ret[t.eq(T - 1)] = r``) is only read where it wins, so its ops must not run elsewhere — at
``t = T - 1`` they would read past the end. An op's guard is the union, over its readers, of
the points they read it at under their own guard and the edge's condition. For same-point
reads that is exactly ``guard(reader) & cond``; any other read (a shift, a slice, a reader
over more dims) conservatively demands every point. Solved as a fixed point, since
recurrences make the graph cyclic.
"""

from __future__ import annotations

from collections.abc import Iterable

from timerl.ir.graph import Op
from timerl.ir.validate import exclusive_conditions
from timerl.symbolic import FALSE, TRUE, Condition, Const, Dim, Expr, simplify

MAX_ROUNDS = 100
WIDEN_AFTER = 6


def _shifts(reader: Op, edge_index: tuple, src: Op) -> dict[Dim, int] | None:
    """``{d: k}`` when the reader at ``p`` reads ``src`` at ``p + k`` on every dim, else None."""
    if reader.domain != src.domain:
        return None
    out = {}
    for d, idx in zip(src.domain, edge_index, strict=True):
        if not isinstance(idx, Expr):
            return None
        diff = idx - d
        if not isinstance(diff, Const):
            return None
        out[d] = diff.value
    return out


def _read_set(cond: Condition, shifts: dict[Dim, int]) -> Condition:
    """The src points ``q = p + k`` read where ``cond`` holds at the reader's point ``p``."""
    moved = {d: d - k for d, k in shifts.items() if k}
    if not moved:
        return cond
    out = cond.substitute(moved)
    for d, back in moved.items():
        out = out & (back >= 0) & (back < d.bound)
    return simplify(out)


def infer_guards(ops: list[Op], roots: Iterable[Op]) -> None:
    """Set ``op.guard`` on every op (TRUE: all points of its domain)."""
    guard: dict[int, Condition] = {op.id: FALSE for op in ops}
    for r in roots:
        guard[r.id] = TRUE
    reads = []
    for reader in ops:
        conds = (
            exclusive_conditions(reader)
            if reader.prim == "merge"
            else [e.cond for e in reader.inputs]
        )
        for edge, cond in zip(reader.inputs, conds, strict=True):
            reads.append((reader, edge, cond))
    changes = {op.id: 0 for op in ops}
    widened: set[int] = set()
    for _ in range(MAX_ROUNDS):
        new = {op.id: FALSE for op in ops}
        for r in roots:
            new[r.id] = TRUE
        for k in widened:
            new[k] = TRUE
        for reader, edge, cond in reads:
            src = edge.src
            if new[src.id] == TRUE:
                continue
            shifts = _shifts(reader, edge.index, src)
            if shifts is not None:
                new[src.id] = simplify(new[src.id] | _read_set(guard[reader.id] & cond, shifts))
            elif guard[reader.id] != FALSE:
                new[src.id] = TRUE
        if new == guard:
            break
        for k in new:
            if new[k] != guard[k]:
                changes[k] += 1
                # a guard that keeps changing follows a recurrence around a cycle: widen it to
                # every point, which is always a sound over-approximation of what is read
                if changes[k] > WIDEN_AFTER:
                    widened.add(k)
                    new[k] = TRUE
        guard = new
    else:
        guard = {op.id: TRUE for op in ops}
    for op in ops:
        op.guard = guard[op.id] if op.effect is False else TRUE
