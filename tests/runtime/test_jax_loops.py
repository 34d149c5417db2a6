"""On the jax backend a loop whose whole body traces runs as one ``lax.fori_loop`` call: the
values equal the numpy reference's, each fused loop is called once per run of the loop (not
once per iteration), traced once per program, and ``explain()`` says which loops were fused
and why the others were not."""

from __future__ import annotations

import re

import numpy as np
import pytest

import timerl as tl
from timerl.ir.build import apply

jax = pytest.importorskip("jax")


def _run_counting(ctx, bounds, outs, seed=0):
    """Compile for jax, run, and count the calls of each fused loop and fused iteration body
    (their keys start with ``"loop"`` and ``"body"``)."""
    prog = ctx.compile(bounds=bounds, outputs=outs, backend="jax", seed=seed)
    calls: dict = {}

    def counting(make):
        def fuse(key, plan):
            fn = make(key, plan)

            def call(*args):
                calls[key] = calls.get(key, 0) + 1
                return fn(*args)

            return call

        return fuse

    prog.backend.fuse_loop = counting(prog.backend.fuse_loop)
    prog.backend.fuse_body = counting(prog.backend.fuse_body)
    prog.run()
    return prog, calls


def _reference(ctx, bounds, outs, seed=0):
    prog = ctx.compile(bounds=bounds, outputs=outs, backend="numpy", seed=seed)
    prog.run()
    return prog, [prog.value(o) for o in outs]


def _explained(prog) -> dict[str, str]:
    """explain()'s loop lines: each loop's header and what became of it."""
    text = prog.explain()
    part = text.split("loops (one XLA loop each, or why not):\n")[1].split("schedule")[0]
    part = part.split("regions run as numpy kernels")[0]
    out = {}
    for line in part.strip().splitlines():
        loop, what = line.strip().split(" -> ")
        out[loop.split(" (")[0]] = what
    return out


def _check(ctx, bounds, outs, seed=0, rtol=1e-6, atol=1e-6):
    ref, want = _reference(ctx, bounds, outs, seed)
    prog, calls = _run_counting(ctx, bounds, outs, seed)
    for a, o in zip(want, outs, strict=True):
        b = prog.value(o)
        assert b.dtype == a.dtype
        np.testing.assert_allclose(b, a, rtol=rtol, atol=atol)
    # the same statements counted, and the same bytes left live, as the Python loops
    ours, theirs = prog.stats(), ref.stats()
    assert ours["statements_executed"] == theirs["statements_executed"]
    assert ours["live_bytes_at_end"] == theirs["live_bytes_at_end"]
    return prog, calls


def test_a_forward_recurrence_is_one_call():
    ctx = tl.Context(dims=("t",))
    (t,), (T,) = ctx.dims, ctx.bounds
    with ctx:
        x = tl.RecurrentTensor.placeholder(shape=(3,), domain=(t,))
        x[0] = tl.from_numpy(np.array([0.5, -1.0, 2.0], dtype=np.float32))
        x[t + 1] = (x[t] * 0.9).tanh() + 0.1
    prog, calls = _check(ctx, {T: 12}, [x])
    assert list(calls.values()) == [1]  # twelve iterations, one call
    assert prog.stats()["jit_loops"] == 1
    assert _explained(prog) == {"for t in 0 .. T-1": "one XLA loop"}


def test_independent_iterations_are_one_vmap(monkeypatch):
    """``next[t] = v[t + 1]``, a bootstrap past the last step (PPO's next values), once ``v``
    is complete: no iteration reads another's, so that loop runs as one vmap."""
    from timerl.runtime import jax_loops

    while_loops = []
    fori_loop = jax_loops.lax.fori_loop
    monkeypatch.setattr(
        jax_loops.lax, "fori_loop", lambda *a: while_loops.append(1) or fori_loop(*a)
    )
    ctx = tl.Context(dims=("t",))
    (t,), (T,) = ctx.dims, ctx.bounds
    with ctx:
        v = tl.RecurrentTensor.placeholder(shape=(4,), domain=(t,))
        v[0] = tl.from_numpy(np.arange(4, dtype=np.float32))
        v[t + 1] = (v[t] * 0.9).tanh() + 0.1
        boot = tl.from_numpy(np.full(4, 3.0, np.float32))
        nxt = tl.RecurrentTensor.placeholder(shape=(4,), domain=(t,))
        nxt[t.eq(T - 1)] = boot * 2.0
        nxt[True] = v[t + 1].tanh()
    prog, calls = _check(ctx, {T: 7}, [nxt])
    assert sum(calls.values()) == len(calls) == 2  # each loop one call
    notes = re.findall(r"for t in 0 \.\. T-1 \(\d ops: (\w+)#\d+\) -> (.*)", prog.explain())
    assert notes == [("merge", "one XLA loop"), ("tanh", "one vmap (iterations independent)")]
    assert len(while_loops) == 1  # traced once: v's recurrence
    vs = [np.arange(4, dtype=np.float32)]
    for _ in range(6):
        vs.append(np.tanh(vs[-1] * np.float32(0.9)) + np.float32(0.1))
    want = np.concatenate([np.tanh(np.stack(vs[1:])), np.full((1, 4), 6.0, np.float32)])
    np.testing.assert_allclose(prog.value(nxt), want, rtol=1e-6)


def test_a_stacked_reshape_is_its_sources_history_reshaped(monkeypatch):
    """``y[t] = x[t].reshape(6)`` with both read whole after the loop (PPO's observations and
    their flattened view): the traced loop keeps one history, ``y``'s is ``x``'s reshaped."""
    from timerl.runtime import jax_backend

    plans = []
    make = jax_backend.loop_function
    monkeypatch.setattr(jax_backend, "loop_function", lambda plan: plans.append(plan) or make(plan))
    ctx = tl.Context(dims=("t",))
    (t,), (T,) = ctx.dims, ctx.bounds
    with ctx:
        x = tl.RecurrentTensor.placeholder(shape=(2, 3), domain=(t,))
        x[0] = tl.from_numpy(np.arange(6, dtype=np.float32).reshape(2, 3))
        x[t + 1] = (x[t] * 0.9).tanh() + 0.1
        y = x.reshape(6)
        flat = y[0:T] @ tl.from_numpy(np.ones(6, np.float32))
        whole = x[0:T].sum(0)
    _check(ctx, {T: 5}, [flat, whole])
    (plan,) = plans
    assert len(plan.derived) == 1 and len(plan.hist) == 1
    ((source, shape),) = plan.derived.values()
    assert source in plan.hist and shape == (6,)


def test_a_backward_recurrence_like_gae():
    """``gae[t] = delta[t] + g * (1 - done[t]) * gae[t + 1]``, the last step its base case:
    a backward loop reading per-step inputs from outside and its own next value."""
    rng = np.random.default_rng(1)
    rewards = rng.normal(size=(9, 4)).astype(np.float32)
    dones = (rng.random((9, 4)) < 0.2).astype(np.float32)
    values = rng.normal(size=(10, 4)).astype(np.float32)
    ctx = tl.Context(dims=("t",))
    (t,), (T,) = ctx.dims, ctx.bounds
    with ctx:
        r = tl.from_numpy(rewards, domain=(t,))
        d = tl.from_numpy(dones, domain=(t,))
        v = tl.from_numpy(values[:-1], domain=(t,))
        v_next = tl.from_numpy(values[1:], domain=(t,))
        delta = r + 0.99 * (1.0 - d) * v_next - v
        gae = tl.RecurrentTensor.placeholder(shape=(4,), domain=(t,))
        gae[t.eq(T - 1)] = delta
        gae[True] = delta + 0.99 * 0.95 * (1.0 - d) * gae[t + 1]
    prog, calls = _check(ctx, {T: 9}, [gae])
    assert sum(calls.values()) == len(calls)  # each fused loop called once
    assert _explained(prog)["for t in T-1 .. 0"] == "one XLA loop"
    # by hand
    want, nxt = np.zeros_like(rewards), np.zeros(4, np.float32)
    for k in reversed(range(9)):
        delta_k = rewards[k] + 0.99 * (1 - dones[k]) * values[k + 1] - values[k]
        nxt = delta_k if k == 8 else delta_k + 0.99 * 0.95 * (1 - dones[k]) * nxt
        want[k] = nxt
    np.testing.assert_allclose(prog.value(gae), want, rtol=1e-5, atol=1e-6)


def test_an_adam_update_loop_over_minibatches():
    """Parameters updated by Adam over ``u``, each step on its own minibatch (a per-step
    read from outside), gradients by autodiff: the whole update loop is one call."""
    rng = np.random.default_rng(2)
    xs = rng.normal(size=(8, 16, 3)).astype(np.float32)
    ys = (xs @ np.array([1.0, -2.0, 0.5], np.float32) + 0.3).astype(np.float32)
    ctx = tl.Context(dims=("u",))
    (u,), (U,) = ctx.dims, ctx.bounds
    with ctx:
        x = tl.from_numpy(xs, domain=(u,))
        y = tl.from_numpy(ys, domain=(u,))
        w = tl.RecurrentTensor.placeholder((3,), domain=(u,), requires_grad=True)
        w[0] = tl.zeros((3,))
        b = tl.RecurrentTensor.placeholder((), domain=(u,), requires_grad=True)
        b[0] = tl.zeros(())
        loss = ((x @ w + b - y) ** 2).mean()
        loss.backward()
        tl.optim.Adam([w, b], lr=0.05).step()
    prog, calls = _check(ctx, {U: 8}, [w, b, loss], rtol=1e-5, atol=1e-6)
    assert max(calls.values()) == 1
    assert prog.value(loss)[-1] < prog.value(loss)[0]
    assert set(_explained(prog).values()) == {"one XLA loop"}


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_random_draws_and_a_window_read(dtype):
    """``x[t] = 0.5 x[t - 1] + 0.25 x[t - 2] + noise``: the draws take the traced index as a
    key coordinate (the reference's numbers), the read two steps back is carried as every
    iteration's value."""
    ctx = tl.Context(dims=("t",))
    (t,), (T,) = ctx.dims, ctx.bounds
    with ctx:
        x = tl.RecurrentTensor.placeholder(shape=(5,), dtype=dtype, domain=(t,))
        x[t < 2] = tl.randn((5,), like=x)
        x[True] = x[t - 1] * 0.5 + x[t - 2] * 0.25 + tl.rand((5,), like=x)
    tol = 1e-6 if dtype == "float32" else 1e-12
    prog, calls = _check(ctx, {T: 11}, [x], seed=3, rtol=tol, atol=tol)
    assert list(calls.values()) == [1]
    assert prog.value(x).dtype == np.dtype(dtype)


def test_an_inner_loop_takes_the_outer_index_traced():
    """A loop over ``t`` inside one over ``i`` reads ``i`` in values, guards and random keys:
    ``i`` is passed as a traced integer, so one trace serves every ``i``."""
    ctx = tl.Context(dims=("i", "t"))
    i, t = ctx.dims
    big_i, big_t = ctx.bounds
    with ctx:
        x = tl.RecurrentTensor.placeholder((2,), domain=(i, t))
        x[i, 0] = tl.full((2,), i)
        x[i, t + 1] = x[i, t] * 0.5 + tl.full((2,), t) + tl.rand((2,), like=x)
        s = x[i, 0:big_t].sum(0)
    prog, calls = _check(ctx, {big_i: 4, big_t: 6}, [x, s], seed=7)
    # each iteration of i, its loop over t nested, is one call
    assert [n for k, n in calls.items() if k[0] == "body"] == [4]
    assert prog.stats()["jit_bodies"] == 1
    traces = prog.stats()["jit_traces"]
    prog.run()  # a second run finds the iteration traced
    assert prog.stats()["jit_traces"] == traces
    explained = _explained(prog)
    assert explained["for i in 0 .. I-1"] == "one XLA program per iteration"
    assert explained["for t in 0 .. T-1"] == "one XLA loop, inside the iteration's"


def test_a_loop_with_a_host_call_stays_in_python_and_says_why():
    def host(a: np.ndarray) -> np.ndarray:
        assert isinstance(a, np.ndarray)
        return a[::-1].copy()

    ctx = tl.Context(dims=("t",))
    (t,), (T,) = ctx.dims, ctx.bounds
    with ctx:
        x = tl.RecurrentTensor.placeholder(shape=(3,), domain=(t,))
        x[0] = tl.from_numpy(np.array([0.3, -0.2, 0.1], dtype=np.float32))
        a = (x[t] * 1.5).tanh()
        flipped = tl.RecurrentTensor(
            apply("udf", a.view, fn=host, shape=(3,), dtype=np.dtype("float32")), ctx
        ).named("flipped")
        x[t + 1] = flipped * 0.5 + a
    prog, calls = _check(ctx, {T: 5}, [x])
    assert not calls and prog.stats()["jit_loops"] == 0
    assert _explained(prog) == {"for t in 0 .. T-1": "runs in Python: flipped (udf) is a host call"}


def test_a_loop_freeing_all_but_its_last_point_keeps_exactly_that_point():
    """A value read after the loop only at its last point is carried, not stacked, and only
    that point is stored."""
    ctx = tl.Context(dims=("u",))
    (u,), (U,) = ctx.dims, ctx.bounds
    with ctx:
        w = tl.RecurrentTensor.placeholder(shape=(4,), domain=(u,))
        w[0] = tl.ones((4,))
        w[u + 1] = w[u] * 0.5 + 1.0
        final = w[U - 1] * 2.0
    prog, calls = _check(ctx, {U: 7}, [final])
    assert list(calls.values()) == [1]
    assert "_f[" in prog._executor().source  # the last value returned, not every iteration's
    np.testing.assert_allclose(prog.value(final), 2.0 * (2.0 - 2.0**-6) * np.ones(4))


def test_a_read_at_a_fixed_point_of_the_loop_sees_that_iterations_value():
    """``x[t + 1] = f(x[t])`` with ``x[0]`` a value computed in the loop at ``t == 0`` and read
    there in the same iteration: the carried array holds each value as soon as it is made."""
    ctx = tl.Context(dims=("t",))
    (t,), (T,) = ctx.dims, ctx.bounds
    with ctx:
        u0 = tl.from_numpy(np.array([0.25, 0.5, 0.75]), domain=(t,), dtype="float64")
        x = tl.RecurrentTensor.placeholder((), dtype="float64", domain=(t,))
        x[0] = u0[0]
        x[t + 1] = (x[t] * 1.5).tanh()
    prog, calls = _check(ctx, {T: 3}, [x], rtol=1e-12, atol=1e-12)
    assert list(calls.values()) == [1]


def test_a_row_store_hands_rows_over_stacked_until_one_is_rewritten():
    from timerl.runtime.row_store import RowStore

    rows = np.arange(12.0).reshape(4, 3)
    store = RowStore({(0, 0): np.zeros(3)})
    store.put_rows((1,), rows, [0, 1, 3])  # row 2 not kept (guarded off)
    assert store.stacked((1,), 4) is rows and store.stacked((0,), 4) is None
    assert len(store) == 4 and (1, 3) in store and (1, 2) not in store
    np.testing.assert_array_equal(store[(1, 1)], rows[1])  # split out alone
    assert store.stacked((1,), 4) is rows
    assert sorted(store.keys()) == [(0, 0), (1, 0), (1, 1), (1, 3)]
    assert store.pop((1, 0)).nbytes == 24  # freed without being split: its bytes
    assert sum(getattr(v, "nbytes", 0) for v in store.values()) == 24 + 24 + 24
    store[(1, 3)] = np.ones(3)  # rewritten: the stacked array is stale now
    assert store.stacked((1,), 4) is None
    np.testing.assert_array_equal(store[(1, 3)], np.ones(3))
    assert dict(store.items()).keys() == {(0, 0), (1, 1), (1, 3)}
    store.clear()
    assert not store and store.stacked((1,), 4) is None


@pytest.mark.parametrize("held", [1, 6])
def test_put_rows_replaces_the_points_it_covers_however_many_are_held(held):
    """Points already held under the outer point at the rows put are replaced (whether the
    store scans its few points or pops each row's key); points elsewhere stay."""
    from timerl.runtime.row_store import RowStore

    store = RowStore({(1, k): np.full(3, -1.0) for k in range(held)})
    store[(0, 2)] = np.zeros(3)
    rows = np.arange(15.0).reshape(5, 3)
    store.put_rows((1,), rows, [0, 1, 2, 3])
    assert len(store) == 4 + 1 + max(held - 4, 0)
    for k in range(4):
        np.testing.assert_array_equal(store[(1, k)], rows[k])
    np.testing.assert_array_equal(store[(0, 2)], np.zeros(3))
    if held > 4:
        np.testing.assert_array_equal(store[(1, 5)], np.full(3, -1.0))


def test_a_loop_reads_an_earlier_loops_rows_stacked():
    """A loop's every-iteration values, read per iteration by a later fused loop and as a
    whole slice, are handed over as the one array the first loop returned."""
    ctx = tl.Context(dims=("t",))
    (t,), (T,) = ctx.dims, ctx.bounds
    with ctx:
        x = tl.RecurrentTensor.placeholder(shape=(2,), domain=(t,))
        x[0] = tl.ones((2,))
        x[t + 1] = x[t] * 0.5 + 1.0
        y = tl.RecurrentTensor.placeholder(shape=(2,), domain=(t,))
        y[t.eq(T - 1)] = x * 2.0
        y[True] = x * 2.0 + y[t + 1]
        total = x[0:T].sum(0)
    prog, calls = _check(ctx, {T: 6}, [y, total])
    assert len(calls) == 2 and set(calls.values()) == {1}
    assert ".stacked(" in prog._executor().source


def test_a_rollout_carried_across_outer_iterations_is_one_call_per_iteration():
    """``x[i + 1, 0] = x[i, T - 1]``: at ``t == 0`` the loop reads a point an earlier run of
    itself computed (from its store, as a value from outside); the merge of the three
    definitions and the slice read after the loop need no Python iteration, and the next
    outer iteration reads the last point without splitting it out of the stacked rows."""
    ctx = tl.Context(dims=("i", "t"))
    (i, t), (I, T) = ctx.dims, ctx.bounds
    with ctx:
        x = tl.RecurrentTensor.placeholder(shape=(3,), domain=(i, t))
        x[0, 0] = tl.from_numpy(np.array([0.5, -1.0, 2.0], dtype=np.float32))
        step = (x * 0.9).tanh() + 0.1
        x[i, t + 1] = step
        x[i + 1, 0] = step[i, T - 1]
        total = x[i, 0:T].sum()
    prog, calls = _check(ctx, {I: 3, T: 5}, [total])
    assert list(calls.values()) == [3]  # one call per outer iteration
    assert _explained(prog)["for i in 0 .. I-1"] == "one XLA program per iteration"


def _bodies(calls: dict) -> list[int]:
    return [n for k, n in calls.items() if k[0] == "body"]


def test_an_iteration_with_two_inner_loops_a_backward_one_and_a_merge_is_one_call():
    """An outer loop over ``i`` holding a forward loop over ``t`` (with a random draw), a
    backward loop over ``t`` reading it (GAE's shape), an update loop over ``u`` whose first
    point merges the previous iteration's weights, and straight-line ops between them: each
    iteration is one call, the values the numpy reference's, and the weights carried from one
    iteration to the next stay device arrays in their stores."""
    ctx = tl.Context(dims=("i", "t", "u"))
    (i, t, u), (I, T, U) = ctx.dims, ctx.bounds
    with ctx:
        w = tl.RecurrentTensor.placeholder((3,), domain=(i, u))
        w0 = tl.from_numpy(np.array([0.3, -0.2, 0.5], dtype=np.float32))
        x = tl.RecurrentTensor.placeholder((3,), domain=(i, t))
        start = tl.RecurrentTensor.placeholder((3,), domain=(i,))
        start[0] = w0
        start[i + 1] = w[i, U - 1]
        x[i, 0] = start * 0.5
        x[i, t + 1] = (x[i, t] + tl.rand((3,), like=x) * 0.1).tanh()
        g = tl.RecurrentTensor.placeholder((3,), domain=(i, t))
        g[t.eq(T - 1)] = x
        g[True] = x + 0.9 * g[i, t + 1] + 0.1 * x[i, t + 1]  # the earlier loop, one ahead
        mean = g[i, 0:T].sum(0) / T  # a straight-line op between the loops
        w[i, 0] = start - 0.1 * mean
        w[i, u + 1] = w[i, u] * 0.95 + 0.01 * mean
        score = w[i, U - 1].sum()
    prog, calls = _check(ctx, {I: 4, T: 5, U: 3}, [score, x], seed=5)
    assert _bodies(calls) == [4]
    explained = _explained(prog)
    assert explained["for i in 0 .. I-1"] == "one XLA program per iteration"
    assert explained["for t in T-1 .. 0"] == "one XLA loop, inside the iteration's"
    traces = prog.stats()["jit_traces"]
    prog.run()  # a second run retraces nothing
    assert prog.stats()["jit_traces"] == traces and _bodies(calls) == [8]


def test_a_fused_iteration_runs_between_iteration_hooks():
    """With hooks (the training driver's case), each iteration is one call and the values the
    hooks read (a sink's) exist after each one."""
    ctx = tl.Context(dims=("i", "t"))
    (i, t), (I, T) = ctx.dims, ctx.bounds
    seen: dict[int, float] = {}
    with ctx:
        x = tl.RecurrentTensor.placeholder((2,), domain=(i, t))
        x[0, 0] = tl.ones((2,))
        x[i, t + 1] = x[i, t] * 0.5 + 1.0
        x[i + 1, 0] = x[i, T - 1] * 0.25
        total = x[i, 0:T].sum()
        tl.sink(total, lambda value, point: seen.__setitem__(point["i"], float(value)))
    ref = ctx.compile(bounds={I: 3, T: 4}, backend="numpy")
    want: dict[int, float] = {}
    ref.executor().run(on_iteration=lambda k: want.__setitem__(k, seen[k]))
    seen.clear()
    got: dict[int, float] = {}
    calls = []
    for n in (3, 5):  # the calls before the loop are the same: the difference is per iteration
        prog = ctx.compile(bounds={I: n, T: 4}, backend="jax")
        prog.executor().run(on_iteration=lambda k: got.__setitem__(k, seen[k]))
        calls.append(prog.stats()["jit_calls"])
        assert prog.stats()["jit_bodies"] == 1
        if n == 3:
            assert got.keys() == want.keys() == {0, 1, 2}
            np.testing.assert_allclose([got[k] for k in range(3)], [want[k] for k in range(3)])
    assert calls[1] - calls[0] == 2  # one call per iteration


def test_an_iteration_whose_inner_loop_calls_the_host_runs_as_regions_and_says_why():
    def host(a: np.ndarray) -> np.ndarray:
        assert isinstance(a, np.ndarray)
        return a * 2.0

    ctx = tl.Context(dims=("i", "t"))
    (i, t), (I, T) = ctx.dims, ctx.bounds
    with ctx:
        x = tl.RecurrentTensor.placeholder((2,), domain=(i, t))
        x[0, 0] = tl.ones((2,))
        doubled = tl.RecurrentTensor(
            apply("udf", x.view, fn=host, shape=(2,), dtype=np.dtype("float32")), ctx
        ).named("doubled")
        x[i, t + 1] = (doubled * 0.3).tanh()
        x[i + 1, 0] = x[i, T - 1]
        total = x[i, 0:T].sum()
    prog, calls = _check(ctx, {I: 3, T: 4}, [total])
    assert not _bodies(calls)
    explained = _explained(prog)
    assert explained["for i in 0 .. I-1"] == (
        "runs in Python, a call per region and inner loop: its loop over t runs in Python: "
        "doubled (udf) is a host call"
    )
