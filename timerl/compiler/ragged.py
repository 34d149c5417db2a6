"""Ragged lengths: an op that reads a length set per point of another dim runs at each of them.

``ctx.until(t, done)`` with ``done[i, t]`` ends ``t`` at its own point for every ``i``: ``T`` is
one episode's length, and the loop over ``t`` runs inside the one over ``i``. An op that reads
``T`` (a mean's count ``full((), T)``, an index ``x[i, T - 1]``, a guard ``t == T - 1``) means the
``T`` of the ``i`` it is computed at, so it must be computed at each ``i``: an op written without
``i`` (the count of ``x[i, 0:T].mean(0)`` has no dim) gets it, and so does every op that reads
one that got it, up to ops over ``i``, which read it at their own ``i``. A tensor the user asked
for, a stop condition or a side effect whose domain would have to change is an error naming it
(its shape, or how often it runs, is the user's). Runs in both modes: it is what the program
means, not an optimisation. Loop-invariant hoisting keeps those dims (``hoist.py``).
"""

from __future__ import annotations

from timerl.compiler.spec import ProgramSpec
from timerl.errors import BoundError
from timerl.ir.graph import Edge, Op, consumers, copy_graph, mentions, order_dims
from timerl.symbolic import Bound, Dim


def spread_ragged_bounds(spec: ProgramSpec) -> ProgramSpec:
    """The program with every op that reads a ragged length over the dims it varies along."""
    ragged = spec.ragged
    if not ragged:
        return spec
    outputs = {op.id for op in spec.outputs}
    stops = {op.id for op in spec.until.values()}
    readers = consumers(spec.ops)
    need: dict[int, set[Dim]] = {}
    why: dict[int, Bound] = {}
    work: list[Op] = []
    for op in spec.ops:
        for bound, dims in ragged.items():
            if mentions(op, bound) and not dims <= set(op.domain):
                need.setdefault(op.id, set()).update(dims - set(op.domain))
                why.setdefault(op.id, bound)
                work.append(op)
    while work:
        op = work.pop()
        if op.id in outputs or op.id in stops or op.effect:
            kind = "a tensor asked for" if op.id in outputs else "a stop condition"
            raise _error(
                op, why[op.id], need[op.id], ragged, "a side effect" if op.effect else kind
            )
        for reader, _ in readers[op.id]:
            missing = need[op.id] - set(reader.domain) - need.get(reader.id, set())
            if missing:
                need.setdefault(reader.id, set()).update(missing)
                why.setdefault(reader.id, why[op.id])
                work.append(reader)
    for op in spec.ops:
        for e in op.inputs:
            for bound, dims in ragged.items():
                if not any(bound in x.symbols() for x in (*e.index, e.cond)):
                    continue
                for d, idx in zip(e.src.domain, e.index, strict=True):
                    if d in dims and idx is not d:
                        raise _elsewhere(op, e, d, bound)
    if not need:
        return spec
    domains = {
        op.id: order_dims(set(op.domain) | need[op.id], spec.dims)
        for op in spec.ops
        if op.id in need
    }
    return spec.with_ops(copy_graph(spec.ops, domains=domains))


def _error(
    op: Op, bound: Bound, dims: set[Dim], ragged: dict[Bound, frozenset[Dim]], kind: str
) -> BoundError:
    over = ", ".join(d.name for d in sorted(ragged[bound], key=lambda d: d.name))
    lacking = ", ".join(sorted(d.name for d in dims))
    return BoundError(
        f"{op.where()} needs {bound.name}, which has its own value at each point of {over} "
        f"(the stop condition of ctx.until varies over {over}), but it is {kind} without "
        f"{lacking}, whose domain the compiler cannot change: read {bound.name} in a tensor "
        f"over {over} instead"
    )


def _elsewhere(op: Op, edge: Edge, dim: Dim, bound: Bound) -> BoundError:
    d, b = dim.name, bound.name
    return BoundError(
        f"{op.where()} reads {edge!r}, at another {d} than its own, but {b} in a read is the "
        f"length at the reader's {d} (ctx.until's stop varies over {d}). Compute the value "
        f"at each {d} first and read that: last = {edge.src.label}[{d}, {b} - 1] * 1.0 is an "
        f"op over {d}, and last[{d} - 1] reads the previous {d}'s"
    )
