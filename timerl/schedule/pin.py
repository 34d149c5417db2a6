"""Pinning: an op outside a recurrence's dim that reads it at one fixed point joins its loop.

``tgt[0] = w[0].detach(); tgt[i + 1] = 0.5 * tgt[i] + 0.5 * w[i].detach()`` with ``w`` updated
from a loss that reads ``tgt[i]``: the base case ``w[0].detach()`` has no dim ``i``, yet it sits
in one dependence cycle with ``w`` and ``tgt``, which do. Its value is needed at ``i = 0`` and
reads ``w`` only at ``i = 0``, so it belongs inside the loop over ``i``, computed once, when
``i == 0``. Pinning gives such an op the dim it lacks, guarded to that one point; its readers
read it at that point. The loop scheduler then sees an ordinary recurrence.

Only the scheduler's fallback uses it (``schedule_program``): programs that schedule as
written keep their ops and stores unchanged.
"""

from __future__ import annotations

from collections.abc import Sequence

import networkx as nx

from timerl.ir.graph import Edge, Op
from timerl.symbolic import Bound, Dim, Expr, Slice


def _fixed_point(index: Expr | Slice) -> Expr | None:
    """The one point a read hits whatever the reader's point (``0``, ``T - 1``), if any."""
    if isinstance(index, Slice):
        return None
    return index if all(isinstance(s, Bound) for s in index.symbols()) else None


def pin_points(ops: Sequence[Op], fixed: set[int] = frozenset()) -> dict[int, dict[Dim, Expr]]:
    """For each op that can be pinned: the dims it lacks and the point of each it belongs at.

    An op qualifies for dim ``d`` when it lies in a dependence cycle with ops over ``d`` and
    every read it makes of that cycle, along ``d``, hits one and the same fixed point (directly,
    or through other pinned ops of the cycle). Cycles where some op cannot be pinned are left
    as they are: the scheduler reports them, as it does when an op of ``fixed`` (a tensor the
    user asked for, whose shape must not change) or a side effect (called with its point)
    would need pinning.
    """
    graph = nx.DiGraph()
    graph.add_nodes_from(op.id for op in ops)
    graph.add_edges_from((e.src.id, op.id) for op in ops for e in op.inputs)
    by_id = {op.id: op for op in ops}
    out: dict[int, dict[Dim, Expr]] = {}
    for comp in nx.strongly_connected_components(graph):
        members = [by_id[k] for k in comp]
        dims = {d for op in members for d in op.domain}
        for dim in dims:
            lacking = [op for op in members if dim not in op.domain]
            if not lacking:
                continue
            pins = _pins_along(lacking, comp, dim)
            if pins is None or any(k in fixed or by_id[k].effect for k in pins):
                continue
            for op_id, point in pins.items():
                out.setdefault(op_id, {})[dim] = point
    return out


def _pins_along(lacking: list[Op], comp: set[int], dim: Dim) -> dict[int, Expr] | None:
    """The point along ``dim`` for each op of ``lacking``, or None when one has none."""
    lacking_ids = {op.id for op in lacking}
    pins: dict[int, Expr] = {}
    changed = True
    while changed:
        changed = False
        for op in lacking:
            points: list[Expr] = []
            for e in op.inputs:
                if e.src.id not in comp:
                    continue
                if e.src.id in lacking_ids:
                    if e.src.id in pins:
                        points.append(pins[e.src.id])
                    continue
                point = _fixed_point(e.index[e.src.domain.index(dim)])
                if point is None:
                    return None
                points.append(point)
            if any(p != points[0] for p in points[1:]):
                return None
            if points and pins.get(op.id) is None:
                pins[op.id] = points[0]
                changed = True
    return pins if len(pins) == len(lacking) else None


def pin(ops: Sequence[Op], pins: dict[int, dict[Dim, Expr]], dims: Sequence[Dim]) -> list[Op]:
    """A copy of ``ops`` (same ids) with each pinned op over the dims it was pinned along,
    computed only at its point, and read there."""
    order = {d: k for k, d in enumerate(dims)}
    new: dict[int, Op] = {}
    for op in ops:
        at = pins.get(op.id)
        if not at:
            new[op.id] = op.unwired()
            continue
        domain = tuple(sorted((*op.domain, *at), key=lambda d: order.get(d, len(order))))
        guard = op.guard
        for d, point in at.items():
            guard = guard & d.eq(point)
        new[op.id] = op.unwired(domain=domain, guard=guard)
    for op in ops:
        edges = []
        for e in op.inputs:
            src = new[e.src.id]
            index = e.index
            at = pins.get(e.src.id)
            if at:
                given = dict(zip(e.src.domain, e.index, strict=True))
                index = tuple(given[d] if d in given else at[d] for d in src.domain)
            edges.append(Edge(src, index, e.cond))
        new[op.id].inputs = edges
    return list(new.values())
