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
    reads: dict[int, list] = {op.id: [] for op in ops}
    for reader in ops:
        conds = (
            exclusive_conditions(reader)
            if reader.prim == "merge"
            else [e.cond for e in reader.inputs]
        )
        for edge, cond in zip(reader.inputs, conds, strict=True):
            reads[edge.src.id].append((reader, edge, cond))
    root_ids = {r.id for r in roots}
    # Readers mostly have larger ids than what they read: visiting ops by decreasing id lets
    # one sweep carry a guard down a whole chain (in-place, Gauss-Seidel style).
    order = sorted(ops, key=lambda o: -o.id)
    changes = {op.id: 0 for op in ops}
    for _ in range(MAX_ROUNDS):
        changed = False
        for op in order:
            if op.id in root_ids or guard[op.id] == TRUE:
                continue
            g: Condition = FALSE
            for reader, edge, cond in reads[op.id]:
                if guard[reader.id] == FALSE:
                    continue
                shifts = _shifts(reader, edge.index, op)
                if shifts is None:
                    g = TRUE
                    break
                g = simplify(g | _read_set(guard[reader.id] & cond, shifts))
            if g != guard[op.id]:
                changes[op.id] += 1
                # Every cycle passes through a piecewise op; one whose guard keeps changing
                # follows a shift around the cycle: widen it to every point (always sound).
                if op.prim == "merge" and changes[op.id] > WIDEN_AFTER:
                    g = TRUE
                guard[op.id] = g
                changed = True
        if not changed:
            break
    else:
        guard = {op.id: TRUE for op in ops}
    for op in ops:
        op.guard = guard[op.id] if op.effect is False else TRUE
