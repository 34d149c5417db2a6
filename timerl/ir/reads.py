"""Which points of each op are read, as conditions over the op's own dims.

An op's needed points are the union, over its readers, of the points they read it at under
their own needed points and the edge's condition: exact for same-point reads, shifts and fixed
points, every point for anything else. Solved as a fixed point, since recurrences make the
graph cyclic. Guard inference uses it to compute ops only where they are read; autodiff to let
a VJP contribute only where the forward value was read.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable

from timerl.ir import prims
from timerl.ir.graph import Op
from timerl.ir.validate import exclusive_conditions
from timerl.symbolic import FALSE, TRUE, Condition, Const, Dim, Expr, simplify
from timerl.symbolic.bounds import union
from timerl.symbolic.expr import And

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


def read_points(reader: Op, edge_index: tuple, src: Op, cond: Condition) -> Condition:
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
        # The reader's condition is also about dims the read does not map: keep the parts
        # of it that are not (a superset of the points read, so still sound).
        parts = out.parts if isinstance(out, And) else (out,)
        out = TRUE
        for part in parts:
            if all(not isinstance(s, Dim) or s in moved for s in part.symbols()):
                out = out & part
    for d, back in moved.items():
        if back is not d:
            out = out & (back >= 0) & (back < d.bound)
    for p in pins:
        out = out & p
    return simplify(out)


def needed_points(ops: list[Op], roots: Iterable[Op]) -> dict[int, Condition]:
    """Op id -> the points of it that ``roots`` (read everywhere) need, transitively."""
    guard: dict[int, Condition] = {op.id: FALSE for op in ops}
    for r in roots:
        guard[r.id] = TRUE
    reads: dict[int, list] = {op.id: [] for op in ops}
    for reader in ops:
        conds = (
            exclusive_conditions(reader)
            if prims.get(reader.prim).traits.piecewise
            else [e.cond for e in reader.inputs]
        )
        for edge, cond in zip(reader.inputs, conds, strict=True):
            reads[edge.src.id].append((reader, edge, cond))
    root_ids = {r.id for r in roots}
    by_id = {op.id: op for op in ops}
    # A worklist: an op is revisited only when one of its readers' needs changed. Readers
    # mostly have larger ids than what they read, so popping the largest id first carries a
    # change down a whole chain in one go.
    heap = [-op.id for op in ops if op.id not in root_ids]
    heapq.heapify(heap)
    pending = {-k for k in heap}
    changes = {op.id: 0 for op in ops}
    budget = MAX_ROUNDS * len(ops)
    seen: dict[tuple[int, Condition], Condition] = {}  # read_points of unchanged readers
    while heap:
        budget -= 1
        if budget < 0:
            return {op.id: TRUE for op in ops}
        op = by_id[-heapq.heappop(heap)]
        pending.discard(op.id)
        if guard[op.id] == TRUE:
            continue
        g: Condition = FALSE
        for reader, edge, cond in reads[op.id]:
            if guard[reader.id] == FALSE:
                continue
            key = (id(edge), guard[reader.id])
            part = seen.get(key)
            if part is None:
                part = seen[key] = read_points(reader, edge.index, op, guard[reader.id] & cond)
            g = union(g, part)  # absorbs disjuncts one another implies
            if g == TRUE or _atoms(g) > MAX_ATOMS:
                g = TRUE
                break
        if g == guard[op.id]:
            continue
        changes[op.id] += 1
        # Every cycle passes through a piecewise op; one whose guard keeps changing follows
        # a shift around the cycle: widen it to every point (always sound).
        if prims.get(op.prim).traits.piecewise and changes[op.id] > WIDEN_AFTER:
            g = TRUE
        guard[op.id] = g
        for e in op.inputs:
            src = e.src.id
            if src not in pending and src not in root_ids:
                pending.add(src)
                heapq.heappush(heap, -src)
    return guard
