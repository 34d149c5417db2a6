"""Ragged lengths: what depends on a length set per point of another dim runs at each of them.

``ctx.until(t, done)`` with ``done[i, t]`` ends ``t`` at its own point for every ``i``: ``T`` is
one episode's length, and the loop over ``t`` runs inside the one over ``i``. Two kinds of op
depend on that ``T`` and so must be computed at each ``i``:

- an op that reads ``T``: a mean's count ``full((), T)``, an index ``x[i, T - 1]``, a guard
  ``t == T - 1``; ``T`` is the length at the ``i`` it is computed at;
- an op over ``t`` written without ``i`` (a schedule ``c = from_numpy(a, domain=(t,))``, a
  recurrence over ``t`` alone): its points run to ``T``, so each ``i`` computes its own.

Such an op gets the dims it lacks, and so does every op that reads one that got them, up to ops
over them, which read it at their own ``i``; a random op keeps its key (its numbers at a point
of ``t`` are the same in every episode). A tensor the user asked for, a stop condition or a
side effect whose domain would have to change is an error naming it (its shape, or how often it
runs, is the user's). So is a read of another ``i`` that only some lengths allow: ``x[i - 1,
T - 1]`` (whose ``T``?) or ``x[0:I, t]`` (an episode that ended before ``t`` has no point
there); point 0 exists in every episode. Runs in both modes: it is what the program means, not
an optimisation. Loop-invariant hoisting keeps those dims (:func:`varies_along`).
"""

from __future__ import annotations

from collections.abc import Mapping

from timerl.compiler.spec import ProgramSpec
from timerl.errors import BoundError
from timerl.ir import prims
from timerl.ir.graph import Edge, Op, consumers, copy_graph, mentions, order_dims
from timerl.ir.reads import conjuncts
from timerl.symbolic import Bound, Const, Dim
from timerl.symbolic.expr import Cmp, Condition, Symbol


def varies_along(op: Op, ragged: Mapping[Bound, frozenset[Dim]]) -> set[Dim]:
    """The dims ``op``'s value varies along through a length set per point of them."""
    out: set[Dim] = set()
    for bound, dims in ragged.items():
        if bound.dim in op.domain or mentions(op, bound):
            out |= dims
    return out


def spread_ragged_bounds(spec: ProgramSpec) -> ProgramSpec:
    """The program with every op that depends on a ragged length over the dims it varies
    along; refused where that is not what the program says."""
    ragged = spec.ragged
    if not ragged:
        return spec
    for op in spec.ops:
        for e in op.inputs:
            _check_read(op, e, ragged)
    outputs = {op.id for op in spec.outputs}
    stops = {op.id for op in spec.until.values()}
    readers = consumers(spec.ops)
    need: dict[int, set[Dim]] = {}
    work: list[Op] = []
    for op in spec.ops:
        missing = varies_along(op, ragged) - set(op.domain)
        if missing:
            need[op.id] = missing
            work.append(op)
    while work:
        op = work.pop()
        if op.id in outputs or op.id in stops or op.effect:
            kind = "a tensor asked for" if op.id in outputs else "a stop condition"
            raise _error(op, need[op.id], "a side effect" if op.effect else kind)
        for reader, _ in readers[op.id]:
            missing = need[op.id] - set(reader.domain) - need.get(reader.id, set())
            if missing:
                need.setdefault(reader.id, set()).update(missing)
                work.append(reader)
    if not need:
        return spec
    domains = {
        op.id: order_dims(set(op.domain) | need[op.id], spec.dims)
        for op in spec.ops
        if op.id in need
    }
    ops = copy_graph(spec.ops, domains=domains)
    for op, old in zip(ops, spec.ops, strict=True):
        if op.id in need and prims.get(op.prim).keyed and "key_at" not in op.attrs:
            # noise over t alone draws the same numbers in every episode
            op.attrs["key_at"] = tuple(old.domain)
    return spec.with_ops(ops)


def _check_read(op: Op, e: Edge, ragged: Mapping[Bound, frozenset[Dim]]) -> None:
    """Refuse a read of another point of a dim that sets a length, where the length there
    would decide what the read means or whether the point exists."""
    index = dict(zip(e.src.domain, e.index, strict=True))
    pinned = _pinned(e.cond)
    for bound, dims in ragged.items():
        dim = bound.dim
        for d in dims:
            if index.get(d, d) is d or dim not in index or pinned.get(d) == index[d]:
                continue  # the reader's own point (a branch ``x[2, t]`` reads at i == 2)
            at_length = any(bound in x.symbols() for x in e.index)
            if not at_length and index[dim] == Const(0):
                continue  # every episode has its first point
            if _gradient(e):
                raise _transposed(op, e, d)
            raise _elsewhere(op, e, d, bound) if at_length else _beyond(op, e, d, dim)


def _pinned(cond: Condition) -> dict[Symbol, Const]:
    """The dims ``cond`` holds at one point (``i == 2``), and those points."""
    out: dict[Symbol, Const] = {}
    for c in conjuncts(cond):
        if isinstance(c, Cmp) and c.op == "==":
            terms, const = c.diff.linear()
            if len(terms) == 1:
                ((atom, coef),) = terms.items()
                if isinstance(atom, Dim) and coef in (1, -1):
                    out[atom] = Const(-const * coef)
    return out


def _error(op: Op, dims: set[Dim], kind: str) -> BoundError:
    lacking = ", ".join(sorted(d.name for d in dims))
    return BoundError(
        f"{op.where()} depends on a length that ctx.until sets at each point of {lacking} (its "
        f"stop condition varies over {lacking}), but it is {kind} without {lacking}, whose "
        f"domain the compiler cannot change: read it in a tensor over {lacking} instead"
    )


def _elsewhere(op: Op, edge: Edge, dim: Dim, bound: Bound) -> BoundError:
    d, b = dim.name, bound.name
    return BoundError(
        f"{op.where()} reads {edge!r}, at another {d} than its own, but {b} in a read is the "
        f"length at the reader's {d} (ctx.until's stop varies over {d}). Compute the value "
        f"at each {d} first and read that: last = {edge.src.label}[{d}, {b} - 1] * 1.0 is an "
        f"op over {d}, and last[{d} - 1] reads the previous {d}'s"
    )


def _beyond(op: Op, edge: Edge, dim: Dim, ragged: Dim) -> BoundError:
    d, t = dim.name, ragged.name
    return BoundError(
        f"{op.where()} reads {edge!r}, at another {d} than its own and a point of {t} that "
        f"{d} may not have: ctx.until ends {t} at its own point for each {d}. Only {t} = 0 "
        f"exists at every {d}; read a tensor over {d} alone (a per-{d} value such as "
        f"x[{d}, 0:{ragged.bound.name}].sum(0)) at another {d}"
    )


def _gradient(edge: Edge) -> bool:
    return (edge.src.name or "").startswith("vjp(")


def _transposed(op: Op, edge: Edge, dim: Dim) -> BoundError:
    d = dim.name
    return BoundError(
        f"a gradient reads {edge!r} (for {op.label}), at other points of {d} than its own: it "
        f"is the transpose of a read of another {d} by a tensor that also runs over a dim "
        f"ctx.until ends at its own point for each {d}, and it would gather points some "
        f"episodes do not have. Read that value at the reader's own {d} (or detach it)"
    )
