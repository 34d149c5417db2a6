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
# Guards are kept as simplified but not normalised And/Or trees; past this many comparisons a
# guard stops paying for itself (and unions around cycles can grow it without end): widen it.
MAX_ATOMS = 24


def _atoms(cond: Condition) -> int:
    parts = getattr(cond, "parts", None)
    if parts is not None:
        return sum(_atoms(p) for p in parts)
    part = getattr(cond, "part", None)
    return _atoms(part) if part is not None else 1


def _read_points(reader: Op, edge_index: tuple, src: Op, cond: Condition) -> Condition:
    """The points of ``src`` that ``reader`` reads where ``cond`` holds at its own point.

    Exact for shifts (``t``, ``t - 1``: move the condition by the shift) and fixed points
    (``x[0]``, ``x[T - 1]``); anything else (slices, reads that mix dims) reads every point.
    """
    moved: dict[Dim, Expr] = {}
    pins: list[Condition] = []
    for d, idx in zip(src.domain, edge_index, strict=True):
        if not isinstance(idx, Expr):
            return TRUE
        dims = {s for s in idx.symbols() if isinstance(s, Dim)}
        if not dims:
            pins.append(d.eq(idx))
            continue
        diff = idx - d
        if dims != {d} or d not in reader.domain or not isinstance(diff, Const):
            return TRUE
        moved[d] = d - diff.value
    out = cond.substitute(moved) if moved else cond
    if any(isinstance(s, Dim) and s not in moved for s in out.symbols()):
        out = TRUE  # the reader's condition is about dims the read does not map: keep it all
    for d, back in moved.items():
        if back is not d:
            out = out & (back >= 0) & (back < d.bound)
    for p in pins:
        out = out & p
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
                g = simplify(g | _read_points(reader, edge.index, op, guard[reader.id] & cond))
                if g == TRUE or _atoms(g) > MAX_ATOMS:
                    g = TRUE
                    break
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
