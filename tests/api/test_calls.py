"""Host calls and pure calls: the user's functions inside a program (``timerl.api.calls``)."""

from __future__ import annotations

import numpy as np
import pytest

import timerl as tl
from timerl.api.calls import Result, host_call, pure_call
from timerl.errors import ProgramError

BACKENDS = ["numpy", "torch"]


def _ramp(t, n=3):
    """``x[t] = [t, t + 1, ..., t + n - 1]`` as float32 over ``t``."""
    x = tl.RecurrentTensor.placeholder((n,), domain=(t,), name="x")
    x[0] = tl.from_numpy(np.arange(n, dtype=np.float32))
    x[t + 1] = x[t] + 1.0
    return x


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_host_call_runs_at_every_point_in_time_order_on_the_inputs_values(backend):
    seen = []

    def double(v):
        seen.append(v.copy())
        return (v * 2.0).astype(np.float32)

    ctx = tl.Context(dims=("t",))
    (t,) = ctx.dims
    with ctx:
        x = _ramp(t)
        y = host_call(double, x, result=Result((3,), "float32"), name="double")
        z = y + 1.0
    prog = ctx.compile(bounds={"T": 4}, backend=backend, outputs=[z])
    prog.run()
    ramp = np.arange(3, dtype=np.float32) + np.arange(4, dtype=np.float32)[:, None]
    np.testing.assert_array_equal(prog.value(z), ramp * 2.0 + 1.0)
    np.testing.assert_array_equal(np.stack(seen), ramp)
    assert y.name == "double"


def test_a_host_call_with_several_results_gives_one_named_tensor_each():
    def split(v):
        return v.sum(keepdims=True).astype(np.float32), (v > 1.5).astype(bool)

    ctx = tl.Context(dims=("t",))
    (t,) = ctx.dims
    with ctx:
        x = _ramp(t)
        total, big = host_call(
            split,
            x,
            results=[Result((1,), "float32", "total"), Result((3,), bool, "big")],
            name="split",
        )
    prog = ctx.compile(bounds={"T": 3}, outputs=[total, big])
    prog.run()
    ramp = np.arange(3.0) + np.arange(3.0)[:, None]
    np.testing.assert_array_equal(prog.value(total), ramp.sum(1, keepdims=True))
    np.testing.assert_array_equal(prog.value(big), ramp > 1.5)
    assert (total.name, big.name) == ("total", "big")
    assert big.dtype == np.dtype(bool)


@pytest.mark.parametrize("backend", BACKENDS)
def test_exact_results_are_delivered_as_returned(backend):
    """``exact``: the function returns the declared dtypes itself (an env step)."""

    def step(v):
        return v.astype(np.float32) * 3.0, (v > 2.0)

    ctx = tl.Context(dims=("t",))
    (t,) = ctx.dims
    with ctx:
        x = _ramp(t)
        a, b = host_call(
            step,
            x,
            results=[Result((3,), "float32", "a"), Result((3,), bool, "b")],
            name="step",
            exact=True,
        )
        out = a * b.float()
    prog = ctx.compile(bounds={"T": 3}, backend=backend, outputs=[out])
    prog.run()
    ramp = np.arange(3.0) + np.arange(3.0)[:, None]
    np.testing.assert_array_equal(prog.value(out), ramp * 3.0 * (ramp > 2.0))


def test_a_host_call_is_an_effect_it_runs_once_per_point_even_if_nothing_reads_it():
    calls = []
    ctx = tl.Context(dims=("t",))
    (t,) = ctx.dims
    with ctx:
        x = _ramp(t)
        host_call(
            lambda v: calls.append(float(v[0])) or np.zeros((), bool),
            x,
            result=Result((), bool),
            name="log",
        )
    ctx.compile(bounds={"T": 5}).run()
    assert calls == [0.0, 1.0, 2.0, 3.0, 4.0]


def test_a_call_without_inputs_runs_where_its_assignment_moves():
    """``obs[i, 0] = reset()`` resets at every ``i`` (``where_assigned``), once per ``i``."""
    resets = []

    def reset():
        resets.append(len(resets))
        return np.full((2,), float(len(resets)), np.float32)

    ctx = tl.Context(dims=("i", "t"))
    i, t = ctx.dims
    with ctx:
        obs = tl.RecurrentTensor.placeholder((2,), domain=(i, t), name="obs")
        obs[i, 0] = host_call(
            reset, result=Result((2,), "float32"), name="reset", where_assigned=True
        )
        obs[i, t + 1] = obs[i, t] + 0.5
        total = obs[i, 0 : t.bound].sum(0)
    prog = ctx.compile(bounds={"I": 3, "T": 2}, outputs=[total])
    prog.run()
    assert resets == [0, 1, 2]
    starts = np.array([1.0, 2.0, 3.0])
    np.testing.assert_allclose(prog.value(total), (2 * starts + 0.5)[:, None] * np.ones(2))


def test_start_begins_each_call_before_it_is_waited_for():
    events = []

    def start(v):
        events.append(("start", float(v[0])))

    def finish(v):
        events.append(("finish", float(v[0])))
        return v * 2.0

    ctx = tl.Context(dims=("t",))
    (t,) = ctx.dims
    with ctx:
        x = _ramp(t)
        y = host_call(finish, x, result=Result((3,), "float32"), name="remote", start=start)
    prog = ctx.compile(bounds={"T": 3}, outputs=[y])
    prog.run()
    for k in range(3):
        assert events.index(("start", k)) < events.index(("finish", k))
    np.testing.assert_array_equal(prog.value(y)[:, 0], [0.0, 2.0, 4.0])


def test_bad_declarations_are_refused_by_the_calls_name():
    with tl.Context(dims=("t",)) as ctx:
        (t,) = ctx.dims
        x = _ramp(t)
        with pytest.raises(ProgramError, match="host_call h: declare either result= or results="):
            host_call(lambda v: v, x, name="h")
        with pytest.raises(ProgramError, match="host_call h: input 0 is a ndarray"):
            host_call(lambda v: v, np.zeros(3), result=Result((3,)), name="h")
        with pytest.raises(ProgramError, match="where_assigned applies to a call without inputs"):
            host_call(lambda v: v, x, result=Result((3,)), name="h", where_assigned=True)
        with pytest.raises(ProgramError, match="exact results need static shapes"):
            host_call(lambda v: v, x, results=[Result((t + 1,))], name="h", exact=True)
        with pytest.raises(ProgramError, match="pure_call p: fn must be callable .* .host"):
            pure_call(lambda v: (v,), x, results=[Result((3,))], name="p")


class _Affine:
    """A pure function with its two faces: ``__call__`` for jax to trace, ``host`` on numpy."""

    def __init__(self) -> None:
        self.host_calls = 0

    def __call__(self, a, b):
        return a * 2.0 + b, a - b

    def host(self, a, b):
        self.host_calls += 1
        return (a * 2.0 + b).astype(np.float32), (a - b).astype(np.float32)


@pytest.mark.parametrize("backend", ["numpy", "torch", "jax"])
def test_a_pure_call_computes_its_function_on_every_backend(backend):
    if backend == "jax":
        pytest.importorskip("jax")
    fn = _Affine()
    ctx = tl.Context(dims=("t",))
    (t,) = ctx.dims
    with ctx:
        x = _ramp(t)
        y = x * 0.5
        s, d = pure_call(
            fn, x, y, results=[Result((3,), "float32", "s"), Result((3,), "float32", "d")], name="f"
        )
        out = s * d
    prog = ctx.compile(bounds={"T": 4}, backend=backend, outputs=[out])
    prog.run()
    ramp = np.arange(3.0) + np.arange(4.0)[:, None]
    np.testing.assert_allclose(prog.value(out), (2.5 * ramp) * (0.5 * ramp), rtol=1e-6)
    if backend != "jax":  # jax traces __call__ instead
        assert fn.host_calls >= 1


def test_a_pure_call_nothing_reads_is_not_run():
    """No effect: unlike a host call, an unused pure call is dead code."""
    fn = _Affine()
    ctx = tl.Context(dims=("t",))
    (t,) = ctx.dims
    with ctx:
        x = _ramp(t)
        pure_call(fn, x, x, results=[Result((3,)), Result((3,))], name="unused")
        out = x * 2.0
    prog = ctx.compile(bounds={"T": 3}, outputs=[out])
    prog.run()
    assert fn.host_calls == 0


def test_arange_of_an_index_expression_follows_the_point():
    """``tl.arange(n)`` with ``n`` an expression: its length is ``n`` at each point."""
    ctx = tl.Context(dims=("t",))
    (t,) = ctx.dims
    with ctx:
        k = tl.arange(tl.min(t + 3, t.bound) - t, dtype="float32")
        total = k.sum()
        length = (k * 0.0 + 1.0).sum()
    prog = ctx.compile(bounds={"T": 5}, outputs=[total, length])
    prog.run()
    lengths = np.minimum(np.arange(5) + 3, 5) - np.arange(5)
    np.testing.assert_array_equal(prog.value(length), lengths)
    np.testing.assert_array_equal(prog.value(total), lengths * (lengths - 1) / 2)
