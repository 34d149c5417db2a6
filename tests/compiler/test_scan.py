"""Linear recurrences run as one scan (compiler/scan.py).

Every program runs generated and interpreted, on numpy and torch, and is compared value for
value with the unoptimised reference (``optimize=False``: the loop as written).
"""

from __future__ import annotations

import contextlib

import numpy as np
import pytest

import timerl as tl
from timerl.rl.algos.returns import discounted_returns, gae

BACKENDS = ["numpy", "torch"]


def _rng() -> np.random.Generator:
    """The same draws for a test whichever tests ran before it in this process (a shared
    generator made the data, and so torch's rounding against numpy's, depend on the order
    the test runner picked)."""
    return np.random.default_rng(3)


def _data(n_i: int, n_t: int, width: int):
    rng = _rng()
    reward = rng.standard_normal((n_i, n_t, width)).astype(np.float32)
    done = rng.random((n_i, n_t, width)) < 0.2
    value = rng.standard_normal((n_i, n_t, width)).astype(np.float32)
    return reward, done, value


def _returns_program(kind: str, n_i: int = 3, n_t: int = 11, width: int = 4):
    """GAE or discounted returns over (i, t), read whole after the loop and at points."""
    reward, done, value = _data(n_i, n_t, width)
    ctx = tl.Context(dims=("i", "t"))
    i, t = ctx.dims
    I, T = ctx.bounds
    with ctx:
        r = tl.from_numpy(reward, domain=(i, t))
        d = tl.from_numpy(done, domain=(i, t))
        v = tl.from_numpy(value, domain=(i, t))
        if kind == "gae":
            out = gae(r, d, v, gamma=0.99, lam=0.95, bootstrap=v[i, T - 1] * 0.5)
        else:
            out = discounted_returns(r, d, gamma=0.9)
        whole = out[i, 0:T].sum(0) * 1.0
        first = out[i, 0] + out[i, T - 1]
    return ctx, {I: n_i, T: n_t}, [whole, first], out


def _forward_program(n_t: int = 9):
    """A forward recurrence ``x[t] = a[t] + c[t] * x[t - 1]`` from ``x[0] = b``."""
    c_np = np.random.default_rng(4).random((2, n_t, 3)).astype(np.float32)
    with _recurrence(n_t) as (ctx, (i, t, I, T), a, x):
        c = tl.from_numpy(c_np, domain=(i, t))
        x[t.eq(0)] = a * 2.0
        x[True] = a + c * x[i, t - 1]
        out = x[i, 0:T].sum(0) + x[i, T - 1]
    return ctx, {I: 2, T: n_t}, [out], x


@contextlib.contextmanager
def _recurrence(n_t: int = 8, u_dims: str = "it"):
    """An (i, t) context, active, with an input ``u`` (over both dims, or ``t`` alone) and a
    placeholder ``x`` of shape (3,) to define: ``(ctx, (i, t, I, T), u, x)``."""
    ctx = tl.Context(dims=("i", "t"))
    i, t = ctx.dims
    I, T = ctx.bounds
    domain = (i, t) if u_dims == "it" else (t,)
    shape = (2, n_t, 3) if u_dims == "it" else (n_t, 3)
    with ctx:
        u = tl.from_numpy(_rng().standard_normal(shape).astype(np.float32), domain=domain)
        x = tl.RecurrentTensor.placeholder((3,), domain=(i, t), name="x")
        yield ctx, (i, t, I, T), u, x


def _values(prog, outs, compiled=None):
    prog.run(compiled=compiled)
    return [np.asarray(prog.value(o)) for o in outs]


def _scans(prog) -> list:
    return [op for op in prog.ops if op.prim == "linear_scan"]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("compiled", [True, False], ids=["generated", "interpreted"])
@pytest.mark.parametrize("kind", ["gae", "returns", "forward"])
def test_a_linear_recurrence_is_one_scan_with_the_loops_values(kind, compiled, backend):
    if kind == "forward":
        ctx, bounds, outs, x = _forward_program()
    else:
        ctx, bounds, outs, x = _returns_program(kind)
    ref = ctx.compile(bounds=bounds, outputs=outs, optimize=False)
    prog = ctx.compile(bounds=bounds, outputs=outs, backend=backend)
    (scan,) = _scans(prog)
    assert scan.attrs["reverse"] == (kind != "forward")
    assert f"scanned {x.name} over t as one linear recurrence" in prog.explain()
    # the scan computes each row as the loop did: on numpy the same values to the bit (torch
    # sums the rows read whole in its own order)
    for a, b in zip(_values(ref, outs), _values(prog, outs, compiled), strict=True):
        if backend == "numpy":
            np.testing.assert_array_equal(a, b)
        else:
            np.testing.assert_allclose(a, b, rtol=1e-6)


def _assert_loop_kept(ctx, bounds, out, why: str) -> None:
    """No scan, ``explain()`` says ``why``, and the values are the reference's."""
    ref = ctx.compile(bounds=bounds, outputs=[out], optimize=False)
    prog = ctx.compile(bounds=bounds, outputs=[out])
    assert not _scans(prog)
    assert f"not scanned x: {why}" in prog.explain(full=True)
    np.testing.assert_array_equal(_values(ref, [out])[0], _values(prog, [out])[0])


def test_terms_that_depend_on_the_recurrence_keep_the_loop():
    """``a[t]`` reads ``x[t + 2]``: the scan could not start before the loop ends."""
    with _recurrence() as (ctx, (i, t, I, T), u, x):
        ahead = tl.RecurrentTensor.placeholder((3,), domain=(i, t), name="ahead")
        ahead[t >= T - 2] = u
        ahead[True] = u + x[i, t + 2] * 0.5
        x[t.eq(T - 1)] = u
        x[True] = ahead + u * x[i, t + 1]
        out = x[i, 0:T].sum(0)
    _assert_loop_kept(ctx, {I: 2, T: 8}, out, "its terms depend on it")


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_recurrence_asked_for_as_an_output_reads_back_its_rows(backend):
    ctx, bounds, outs, x = _returns_program("gae")
    ref = ctx.compile(bounds=bounds, outputs=[x], optimize=False)
    prog = ctx.compile(bounds=bounds, outputs=[x], backend=backend)  # the user reads x itself
    assert len(_scans(prog)) == 1
    np.testing.assert_allclose(_values(ref, [x])[0], _values(prog, [x])[0], rtol=1e-6)


def test_a_base_over_two_points_keeps_the_loop():
    with _recurrence() as (ctx, (i, t, I, T), u, x):
        x[t >= T - 2] = u  # two points of base: not a first-order recurrence from one end
        x[True] = u + u * x[i, t + 1]
        out = x[i, 0:T].sum(0)
    prog = ctx.compile(bounds={I: 2, T: 8}, outputs=[out])
    assert not _scans(prog)
    assert "scanned x" not in prog.explain(full=True)  # not a linear recurrence: no note


def test_the_pass_can_be_turned_off():
    ctx, bounds, outs, _ = _returns_program("gae")
    assert not _scans(
        ctx.compile(bounds=bounds, outputs=outs, options=tl.CompileOptions(scan=False))
    )


def test_terms_defined_only_where_the_step_applies_keep_the_loop():
    """``c[t]`` reads ``u[t + 1]``: defined for ``t < T - 1`` only, where the step applies;
    the scan would read it over the whole range, so the loop stays."""
    with _recurrence(6, u_dims="t") as (ctx, (i, t, I, T), u, x):
        a = tl.from_numpy(_rng().standard_normal((2, 6, 3)).astype(np.float32), domain=(i, t))
        x[t.eq(T - 1)] = a
        x[True] = a + (u[t + 1] * 0.5).tanh() * x[i, t + 1]
        out = x[i, 0:T].sum(0)
    _assert_loop_kept(ctx, {I: 2, T: 6}, out, "its terms are not defined at every point")
