"""Branches at the bounds being compiled: folded, and dropped where they apply to no point.

``x[i, 1] = u`` under ``T = 1``, or ``x[i + 2, t] = w`` under ``I = 1``, defines no point, so it
reads nothing: the program means what it would without that branch. Left in, the branch's reads
(``u[i, 1]``, a read at ``t = 1`` of a dim of one point) would be validated, vectorised into a
pick of a row that does not exist and guarded by conditions no loop can hold; dropping it first
makes every later pass see the program the user meant. Its gradient goes with it: autodiff
gives a value read only by such a branch a contribution conditioned on the bounds having its
point (``T >= 2``, ``ir/reads.needed_points``), a branch this pass folds and drops in turn.

A branch's parts about static bounds alone are decided, and the branch dropped only where that
is certain: its condition (under the branches before it:
the first matching branch wins), with the static bounds put in, is evaluated at every point of
the dims it mentions (a dim ended by ``until``: every point up to its cap, a superset of the
points it will have). A condition over a dynamic bound itself, a dim without a cap, or more
than ``MAX_POINTS`` points is kept. A merge that folding leaves with one branch read whole at
every point (a gradient's ``merge(g if T >= 2, 0)``) is that branch.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from timerl.compiler.spec import ProgramSpec
from timerl.ir import prims
from timerl.ir.graph import Edge, Op, View, copy_graph, walk
from timerl.ir.validate import exclusive_conditions
from timerl.symbolic import FALSE, TRUE, Bound, Condition, Const, Dim, vevaluate
from timerl.symbolic.expr import And

MAX_POINTS = 1 << 22  # points a condition is evaluated at, at most (a few ms of numpy)


def drop_empty_branches(spec: ProgramSpec) -> ProgramSpec:
    """The spec with branch conditions folded over the static bounds, every branch that
    applies to no point removed, and what only such branches read."""
    values = {b: Const(v) for b, v in spec.static.items()}
    extents = _extents(spec)
    kept: dict[int, list[tuple[int, Condition]]] = {}  # merge id -> (position, folded cond)
    redirect: dict[int, Op] = {}
    for op in spec.ops:
        if not prims.get(op.prim).traits.piecewise or not op.inputs:
            continue
        folded = [_fold(e.cond, spec.static) for e in op.inputs]
        exclusive = exclusive_conditions(op)
        branches = [
            (k, cond)
            for k, cond in enumerate(folded)
            if not _applies_nowhere(exclusive[k], values, extents)
        ]
        if not branches:
            continue  # defines no point: validation names the undefined points
        if len(branches) == len(op.inputs) and all(
            c == e.cond for c, e in zip(folded, op.inputs, strict=True)
        ):
            continue
        kept[op.id] = branches
        if len(branches) == 1 and _whole(op, op.inputs[branches[0][0]], branches[0][1], spec):
            redirect[op.id] = op.inputs[branches[0][0]].src
    if not kept:
        return spec
    ops = copy_graph(spec.ops, redirect=redirect)
    for op in ops:
        if op.id in kept:
            op.inputs = [Edge(op.inputs[k].src, op.inputs[k].index, c) for k, c in kept[op.id]]
    by_id = {op.id: op for op in ops}
    return spec.with_ops(walk(by_id[r.id] for r in spec.roots))


def _fold(cond: Condition, static: Mapping[Bound, int]) -> Condition:
    """``cond`` with its parts about static bounds alone decided (``T >= 2`` holds or not);
    the parts about dims are kept as written, since the scheduler reads directions in them
    relative to the bounds (``t < T - 1``)."""
    parts = cond.parts if isinstance(cond, And) else (cond,)
    out: Condition = TRUE
    for part in parts:
        symbols = part.symbols()
        if symbols and all(isinstance(s, Bound) and s in static for s in symbols):
            if not part.evaluate(static):
                return FALSE
            continue
        out = out & part
    return out if out != cond else cond


def _whole(merge: Op, edge: Edge, cond: Condition, spec: ProgramSpec) -> bool:
    """Whether ``merge`` is its one branch: read unconditionally at the merge's own point,
    of its shape and dtype, and the merge no value the program hands out."""
    return (
        cond == TRUE
        and merge.id not in spec.keep
        and all(r.id != merge.id for r in spec.roots)
        and edge.src.domain == merge.domain
        and View(edge.src, edge.index).is_identity
        and edge.src.shape == merge.shape
        and edge.src.dtype == merge.dtype
    )


def _extents(spec: ProgramSpec) -> dict[Dim, int]:
    """Every dim's number of points, a dynamic one's cap (a superset of its points)."""
    sizes: dict[Bound, int] = dict(spec.static)
    sizes.update({b: cap for b, cap in spec.dynamic.items() if cap is not None})
    return {d: sizes[d.bound] for d in spec.dims if d.bound in sizes}


def _applies_nowhere(
    cond: Condition, values: Mapping[Bound, Const], extents: dict[Dim, int]
) -> bool:
    cond = cond.substitute(values)
    symbols = cond.symbols()
    if not symbols:
        return not cond.evaluate({})
    dims = [s for s in symbols if isinstance(s, Dim)]
    if len(dims) != len(symbols) or any(d not in extents for d in dims):
        return False  # a dynamic bound, or a dim of unknown extent
    sizes = [extents[d] for d in dims]
    if int(np.prod(sizes)) > MAX_POINTS:
        return False
    axes = np.meshgrid(*[np.arange(s) for s in sizes], indexing="ij")
    env = {d: axis.ravel() for d, axis in zip(dims, axes, strict=True)}
    return not np.any(vevaluate(cond, env))
