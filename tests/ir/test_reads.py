"""Needed and computable points, alone: what guard inference is built from."""

from __future__ import annotations

import numpy as np
from core_helpers import ctx_t

import timerl as tl
from timerl.compiler.guards import add_guards
from timerl.compiler.spec import freeze
from timerl.ir.graph import copy_graph, walk
from timerl.ir.reads import computable_points, needed_points
from timerl.ir.validate import reads_within_guards
from timerl.symbolic import TRUE, vevaluate


def _holds(cond, t, T, n):
    return [bool(vevaluate(cond, {t: k, T: n})) for k in range(n)]


def test_computable_points_follow_shifted_reads_down_to_a_piecewise_op():
    ctx, t, T = ctx_t()
    with ctx:
        u = tl.from_numpy(np.arange(5.0), domain=(t,))
        x = tl.RecurrentTensor.placeholder((), domain=(t,))
        x[0] = u[0]
        x[t + 1] = x * 0.5
        a = x[t - 1].tanh()  # reads x one step back: not at t = 0
        b = a[t - 1] + u[t + 1]  # and a one more back, u one ahead: 2 <= t <= T - 2
    ops = list(walk([b.op]))
    can = computable_points(ops)
    assert can[x.op.id] == TRUE  # piecewise: a branch per point
    assert _holds(can[a.op.id], t, T, 5) == [False, True, True, True, True]
    assert _holds(can[b.op.id], t, T, 5) == [False, False, True, True, False]


def test_needed_points_are_exact_and_uncapped_on_one_form():
    ctx, t, T = ctx_t()
    with ctx:
        u = tl.from_numpy(np.arange(5.0), domain=(t,))
        g = tl.RecurrentTensor.placeholder((), domain=(t,))
        g[t.eq(T - 1)] = u.tanh()
        g[True] = g[t + 1] * 0.5 - u
    ops = list(walk([g.op]))
    needed = needed_points(ops, [g.op])
    assert not needed.capped
    branch = g.op.inputs[1].src  # g[t + 1] * 0.5 - u: read where t < T - 1 only
    assert _holds(needed[branch.id], t, T, 5) == [True, True, True, True, False]


def test_a_read_outside_a_guard_is_found():
    ctx, t, T = ctx_t()
    with ctx:
        u = tl.from_numpy(np.arange(5.0), domain=(t,))
        a = u.tanh()
        b = a[0] * 2.0  # needs a at t = 0 only
    spec = freeze([], [b.op], ctx.dims, ctx._until, *ctx.resolve_bounds({}))
    ops = list(add_guards(spec).ops)
    guard_of_a = next(op.guard for op in ops if op.id == a.op.id)
    assert _holds(guard_of_a, t, T, 5) == [True, False, False, False, False]
    assert reads_within_guards(ops, spec.check_bounds, {a.op.id})
    narrowed = {op.id: op.guard for op in ops}
    narrowed[a.op.id] = t >= 1  # a guard that misses the point b reads
    wrong = copy_graph(ops, guards=narrowed)
    assert not reads_within_guards(wrong, spec.check_bounds, {a.op.id})


def test_a_slice_read_needs_its_dim_whole_and_only_the_readers_other_points():
    """``y[i] = x[i, 0:T].sum(0)`` needed only where ``i >= 1`` needs every ``t`` of ``x``,
    but only at ``i >= 1`` (a gathered block loop's values, computed where their reader
    runs)."""
    from timerl.ir.reads import read_points
    from timerl.symbolic import Const, Slice

    ctx = tl.Context(dims=("i", "t"))
    (i, t), (I, T) = ctx.dims, ctx.bounds
    with ctx:
        x = tl.from_numpy(np.ones((3, 4)), domain=(i, t)).tanh()
    reader = x.op  # any op over (i, t) stands for the reader's dims here
    got = read_points(reader, (i, Slice(Const(0), T)), x.op, i >= 1)
    assert [bool(vevaluate(got, {i: k, t: 0, I: 3, T: 4})) for k in range(3)] == [
        False,
        True,
        True,
    ]
    assert t not in got.symbols()


def test_a_read_is_carried_along_outer_dims_only():
    """``carried(e, t)``: a read moving along a dim outside ``t`` links two of its points and
    is no dependence within one ``t``; one moving along a dim nested inside ``t`` (``s - 1``)
    stays within that ``t`` (the vectoriser's and the scan pass's shared rule)."""
    from timerl.ir.graph import Edge, Op, carried

    ctx = tl.Context(dims=("i", "t", "s"))
    i, t, s = ctx.dims
    f32 = np.dtype("float32")
    z = Op("const", (i, t, s), (), f32, attrs={"value": None})
    assert carried(Edge(z, (i - 1, t, s)), t)
    assert not carried(Edge(z, (i, t, s - 1)), t)
    assert not carried(Edge(z, (i, t - 1, s)), t)  # along t itself: the loop's own recurrence
    flat = Op("const", (i, s), (), f32, attrs={"value": None})
    assert carried(Edge(flat, (i, s - 1)), t)  # not over t: any other dim it moves along
