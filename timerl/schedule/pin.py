"""Pinning: an op outside a recurrence's dim that reads it at one fixed point joins its loop.

``tgt[0] = w[0].detach(); tgt[i + 1] = 0.5 * tgt[i] + 0.5 * w[i].detach()`` with ``w`` updated
from a loss that reads ``tgt[i]``: the base case ``w[0].detach()`` has no dim ``i``, yet it sits
in one dependence cycle with ``w`` and ``tgt``, which do. Its value is needed at ``i = 0`` and
reads ``w`` only at ``i = 0``, so it belongs inside the loop over ``i``, computed once, when
``i == 0``. Pinning gives such an op the dim it lacks, guarded to that one point; its readers
read it at that point. The loop scheduler then sees an ordinary recurrence.

A dim ended by ``ctx.until`` asks the same of what its stop condition needs, cycle or not:
all of it runs in the one loop that ends the dim. ``x[0] = r[0] * 0; x[t + 1] = x[t] + r[t];
ctx.until(t, x >= 2)`` reads ``r`` at ``t = 0`` from an op without ``t`` that the loop then
needs; without the pin it would take a loop over ``r`` of its own before the stopping one.

Only the scheduler's fallback uses it (``schedule_program``): programs that schedule as
written keep their ops and stores unchanged.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import networkx as nx

from timerl.ir.graph import Edge, Op
from timerl.symbolic import Bound, Dim, Expr, Slice


def _fixed_point(index: Expr | Slice) -> Expr | None:
    """The one point a read hits whatever the reader's point (``0``, ``T - 1``), if any."""
    if isinstance(index, Slice):
        return None
    return index if all(isinstance(s, Bound) for s in index.symbols()) else None


def pin_points(
    ops: Sequence[Op], fixed: set[int] = frozenset(), until: Mapping[Dim, Op] | None = None
) -> dict[int, dict[Dim, Expr]]:
    """For each op that can be pinned: the dims it lacks and the point of each it belongs at.

    An op qualifies for dim ``d`` when it lies in a dependence cycle with ops over ``d`` and
    every read it makes of that cycle, along ``d``, hits one and the same fixed point (directly,
    or through other pinned ops of the cycle). Cycles where some op cannot be pinned are left
    as they are: the scheduler reports them, as it does when an op of ``fixed`` (a tensor the
    user asked for, whose shape must not change) or a side effect (called with its point)
    would need pinning. For a dim ended by ``until``, what its stop condition needs counts as
    one such cycle; the ops of it without the dim that read none of its ops over the dim
    (a reset, the weights) run before the loop as they are, and a point that names the dim's
    bound (``x[T - 1]``) is not known inside that loop. There an op of ``fixed`` is pinned
    too: ``pin`` computes it a second time, as asked for.
    """
    graph = nx.DiGraph()
    graph.add_nodes_from(op.id for op in ops)
    graph.add_edges_from((e.src.id, op.id) for op in ops for e in op.inputs)
    by_id = {op.id: op for op in ops}
    groups = [(comp, None) for comp in nx.strongly_connected_components(graph)]
    for dim, stop in (until or {}).items():
        if stop.id in by_id:
            groups.append((nx.ancestors(graph, stop.id) | {stop.id}, dim))
    out: dict[int, dict[Dim, Expr]] = {}
    for comp, only in groups:
        members = [by_id[k] for k in comp]
        dims = {only} if only is not None else {d for op in members for d in op.domain}
        for dim in dims:
            lacking = [op for op in members if dim not in op.domain]
            if only is not None:
                lacking = _reading_along(lacking, members, dim)
            if not lacking:
                continue
            pins = _pins_along(lacking, comp, dim, dim.bound if only is not None else None)
            # a tensor asked for keeps its shape: pinned, it is computed twice (``pin``)
            if pins is None or any((k in fixed and only is None) or by_id[k].effect for k in pins):
                continue
            for op_id, point in pins.items():
                out.setdefault(op_id, {})[dim] = point
    return out


def _reading_along(lacking: list[Op], members: list[Op], dim: Dim) -> list[Op]:
    """The ops of ``lacking`` that read an op over ``dim`` among ``members``, directly or
    through other such ops (``members`` in any order)."""
    over = {op.id for op in members if dim in op.domain}
    reading: set[int] = set()
    changed = True
    while changed:
        changed = False
        for op in lacking:
            if op.id not in reading and any(e.src.id in over | reading for e in op.inputs):
                reading.add(op.id)
                changed = True
    return [op for op in lacking if op.id in reading]


def _pins_along(
    lacking: list[Op], comp: set[int], dim: Dim, unknown: Bound | None = None
) -> dict[int, Expr] | None:
    """The point along ``dim`` for each op of ``lacking``, or None when one has none (or one
    that names ``unknown``)."""
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
                if dim not in e.src.domain:  # runs before the loop (until's stop needs it)
                    continue
                point = _fixed_point(e.index[e.src.domain.index(dim)])
                if point is None or (unknown is not None and unknown in point.symbols()):
                    return None
                points.append(point)
            if any(p != points[0] for p in points[1:]):
                return None
            if points and pins.get(op.id) is None:
                pins[op.id] = points[0]
                changed = True
    return pins if len(pins) == len(lacking) else None


def pin(
    ops: Sequence[Op],
    pins: dict[int, dict[Dim, Expr]],
    dims: Sequence[Dim],
    fixed: set[int] = frozenset(),
) -> list[Op]:
    """A copy of ``ops`` (same ids) with each pinned op over the dims it was pinned along,
    computed only at its point, and read there. A pinned op of ``fixed`` stays as it is,
    read by nobody, and its readers read a pinned copy of it (a new op) instead."""
    order = {d: k for k, d in enumerate(dims)}
    new: dict[int, Op] = {}
    read: dict[int, Op] = {}  # what the readers of a pinned op of ``fixed`` read instead
    for op in ops:
        at = pins.get(op.id)
        if not at:
            new[op.id] = op.unwired()
            continue
        domain = tuple(sorted((*op.domain, *at), key=lambda d: order.get(d, len(order))))
        guard = op.guard
        for d, point in at.items():
            guard = guard & d.eq(point)
        if op.id in fixed:
            new[op.id] = op.unwired()
            read[op.id] = Op(
                op.prim,
                domain,
                op.shape,
                op.dtype,
                attrs=dict(op.attrs),
                name=op.name,
                site=op.site,
                guard=guard,
            )
        else:
            new[op.id] = op.unwired(domain=domain, guard=guard)
    for op in ops:
        edges = []
        for e in op.inputs:
            src = read.get(e.src.id, new[e.src.id])
            index = e.index
            at = pins.get(e.src.id)
            if at:
                given = dict(zip(e.src.domain, e.index, strict=True))
                index = tuple(given[d] if d in given else at[d] for d in src.domain)
            edges.append(Edge(src, index, e.cond))
        new[op.id].inputs = edges
        if op.id in read:
            read[op.id].inputs = [Edge(e.src, e.index, e.cond) for e in edges]
    return [*new.values(), *read.values()]
