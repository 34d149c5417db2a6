"""Circular buffers: a tensor read only within a bounded window of its loop keeps ``k + 1`` rows.

Every program runs generated and as the reference, on numpy and torch, and is compared value for
value with the unoptimised reference (``optimize=False``: point stores only).
"""

from __future__ import annotations

import numpy as np
import pytest

import timerl as tl
from timerl.memory.liveness import MAX_LAG
from timerl.runtime.stores import RingStore

BACKENDS = ["numpy", "torch"]
RNG = np.random.default_rng(7)


def _inputs(n: int, width: int = 4):
    return RNG.standard_normal((n, width)).astype(np.float32)


def _previous(n: int = 12):
    """``x[t] = tanh(x[t - 1] / 2 + u[t])``, read at ``t - 1`` and ``t``: two rows."""
    ctx = tl.Context(dims=("t",))
    (t,), (T,) = ctx.dims, ctx.bounds
    with ctx:
        u = tl.from_numpy(_inputs(n), domain=(t,))
        x = tl.RecurrentTensor.placeholder((4,), domain=(t,), name="x")
        x[t.eq(0)] = u
        x[True] = (x[t - 1] * 0.5 + u).tanh()
        y = x * 2.0
    return ctx, {T: n}, [y], "x", 2


def _window(n: int = 12):
    """A clamped window ``x[max(t - 3, 0):t + 1]`` summed at every t: four rows."""
    ctx = tl.Context(dims=("t",))
    (t,), (T,) = ctx.dims, ctx.bounds
    with ctx:
        u = tl.from_numpy(_inputs(n), domain=(t,))
        x = tl.RecurrentTensor.placeholder((4,), domain=(t,), name="x")
        x[t.eq(0)] = u
        x[True] = (x[t - 1] * 0.9 + u).tanh()
        w = x[tl.max(t - 3, 0) : t + 1].sum(0) * 1.0
    return ctx, {T: n}, [w], "x", 4


def _backward(n: int = 12):
    """A discounted return ``r[t] = u[t] + 0.9 r[t + 1]``: a backward loop, two rows."""
    ctx = tl.Context(dims=("t",))
    (t,), (T,) = ctx.dims, ctx.bounds
    with ctx:
        u = tl.from_numpy(_inputs(n), domain=(t,))
        r = tl.RecurrentTensor.placeholder((4,), domain=(t,), name="r")
        r[t.eq(T - 1)] = u
        r[True] = u + 0.9 * r[t + 1]
        out = r * 2.0
    return ctx, {T: n}, [out], "r", 2


def _nested(n: int = 9):
    """A window along t inside a loop over i (one ring per i), clamped at the end of t."""
    ctx = tl.Context(dims=("i", "t"))
    (i, t), (_, T) = ctx.dims, ctx.bounds
    with ctx:
        u = tl.from_numpy(RNG.standard_normal((3, n, 2)).astype(np.float32), domain=(i, t))
        x = tl.RecurrentTensor.placeholder((2,), domain=(i, t), name="x")
        x[t.eq(T - 1)] = u
        x[True] = (x[i, t + 1] - u).tanh()
        w = x[i, t : tl.min(t + 3, T)].sum(0) * 1.0
    return ctx, {T: n}, [w], "x", 3


def _long_lag(n: int = 3 * MAX_LAG):
    """A lag of ``MAX_LAG + 36``: liveness keeps such a window whole, the ring keeps its rows."""
    lag = MAX_LAG + 36
    ctx = tl.Context(dims=("t",))
    (t,), (T,) = ctx.dims, ctx.bounds
    with ctx:
        x = tl.RecurrentTensor.placeholder((64,), domain=(t,), name="x")
        x[t < lag] = tl.randn((64,), like=x)
        x[True] = (x[t - lag] * 0.5 + 0.25).tanh()
        y = x.sum(0) * 1.0
    return ctx, {T: n}, [y], "x", lag + 1


PROGRAMS = [_previous, _window, _backward, _nested, _long_lag]


def _run(ctx, bounds, outs, optimize=True, backend="numpy", compiled=None):
    prog = ctx.compile(bounds=bounds, outputs=outs, optimize=optimize, backend=backend)
    prog.run(compiled=compiled)
    return prog, [np.asarray(prog.value(o)) for o in outs]


@pytest.mark.parametrize("make", PROGRAMS)
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("compiled", [True, False], ids=["generated", "reference"])
def test_ring_matches_the_reference(make, backend, compiled):
    ctx, bounds, outs, name, rows = make()
    prog, got = _run(ctx, bounds, outs, backend=backend, compiled=compiled)
    _, want = _run(ctx, bounds, outs, optimize=False)
    op = next(op for op in prog.ops if op.label == name)
    st = prog.compiled.storage[op.id]
    assert (st.kind, st.extent) == ("ring", rows), st
    assert f"{name}: ring (" in prog.explain() and f"circular, {rows} rows" in prog.explain()
    for a, b in zip(got, want, strict=True):
        if backend == "numpy":  # the same kernels: the same bits
            np.testing.assert_array_equal(a, b)
        else:  # torch sums in another order
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)
    # the planned peak is the measured one
    assert prog.planned_peak().peak_bytes == prog.stats()["peak_bytes"]


def test_the_ring_holds_only_its_rows():
    ctx, bounds, outs, name, rows = _window()
    prog = ctx.compile(bounds=bounds, outputs=outs)
    ex = prog.executor()
    op = next(op for op in prog.ops if op.label == name)
    ex.run()
    store = ex.stores[op.id]
    assert isinstance(store, RingStore)
    # the loop's end freed the ring; a run leaves nothing of it behind
    assert not store.blocks


def test_a_long_window_costs_its_rows_not_the_whole_loop():
    """Liveness keeps a window longer than MAX_LAG whole until its loop ends; the ring holds
    its rows, so the planned (and measured) peak drops by the rest of the loop's points."""
    ctx, bounds, outs, name, rows = _long_lag()
    n = next(iter(bounds.values()))
    row_bytes = 64 * 4
    prog, got = _run(ctx, bounds, outs)
    ref, want = _run(ctx, bounds, outs, optimize=False)
    np.testing.assert_array_equal(got[0], want[0])
    ring, points = prog.planned_peak(), ref.planned_peak()
    assert dict(ring.holders)[name] == rows * row_bytes
    assert dict(points.holders)[name] >= (n - 1) * row_bytes
    assert ring.peak_bytes < points.peak_bytes - (n - 1 - rows) * row_bytes
    assert ring.peak_bytes == prog.stats()["peak_bytes"]


def test_a_read_after_the_loop_keeps_a_point_store():
    ctx = tl.Context(dims=("t",))
    (t,), (T,) = ctx.dims, ctx.bounds
    with ctx:
        u = tl.from_numpy(_inputs(6), domain=(t,))
        x = tl.RecurrentTensor.placeholder((4,), domain=(t,), name="x")
        x[t.eq(0)] = u
        x[True] = x[t - 1] * 0.5 + u
        last = x[T - 1] * 1.0
    prog = ctx.compile(bounds={T: 6}, outputs=[last])
    op = next(op for op in prog.ops if op.label == "x")
    assert prog.compiled.storage[op.id].kind == "point"


def test_a_view_reader_keeps_a_point_store():
    """A reshape of x[t - 1] may be the row itself; the row is overwritten two points later."""
    ctx = tl.Context(dims=("t",))
    (t,), (T,) = ctx.dims, ctx.bounds
    with ctx:
        u = tl.from_numpy(_inputs(6), domain=(t,))
        x = tl.RecurrentTensor.placeholder((4,), domain=(t,), name="x")
        x[t.eq(0)] = u
        x[True] = x[t - 1] * 0.5 + u
        y = tl.RecurrentTensor.placeholder((2, 2), domain=(t,))
        y[t.eq(0)] = u.reshape(2, 2)
        y[True] = x[t - 1].reshape(2, 2)
    prog, got = _run(ctx, {T: 6}, [y])
    _, want = _run(ctx, {T: 6}, [y], optimize=False)
    np.testing.assert_allclose(got[0], want[0], rtol=1e-6)
    op = next(op for op in prog.ops if op.label == "x")
    assert prog.compiled.storage[op.id].kind == "point"
