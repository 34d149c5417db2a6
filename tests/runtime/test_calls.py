"""The one op-calling path: what is bound once, what is evaluated per point, and that the
reference and the optimised generated code call ops the same way."""

from __future__ import annotations

import numpy as np
import pytest

import timerl as tl
from timerl.ir import prims
from timerl.ir.build import apply
from timerl.runtime.calls import prepare_call
from timerl.runtime.numpy_backend import NumpyBackend
from timerl.symbolic import Const


def _dims():
    ctx = tl.Context(dims=("i", "t"))
    return ctx.dims


def test_random_op_key_is_seed_stream_and_its_point():
    i, t = _dims()
    op = apply("uniform", domain=(i, t), shape=(Const(2),), dtype=np.dtype("float32"), stream=5).op
    call = prepare_call(op, NumpyBackend(), seed=3)
    assert call.key == ((3, 5), (i, t))
    assert dict(call.point_attrs) == {"shape": (Const(2),)}
    # the op's own attrs (stream) are not passed: the reference signature would reject them
    got = call.fn(shape=(2,), key=(3, 5, 1, 4))
    np.testing.assert_array_equal(got, prims.get("uniform").impl((2,), "float32", (3, 5, 1, 4)))


def test_key_at_replaces_the_point_and_is_not_an_attribute():
    i, t = _dims()
    op = apply(
        "normal", domain=(i, t), shape=(), dtype=np.dtype("float32"), stream=2, key_at=(i, t - 1)
    ).op
    call = prepare_call(op, NumpyBackend(), seed=0)
    (prefix, coords) = call.key
    assert prefix == (0, 2) and coords[0] is i and coords[1] == t - 1
    assert "key_at" not in dict(call.point_attrs)


def test_a_stream_less_random_op_uses_its_id():
    (i, _) = _dims()
    op = apply("uniform", domain=(i,), shape=(), dtype=np.dtype("float32")).op
    assert prepare_call(op, NumpyBackend(), seed=9).key[0] == (9, op.id)


def test_static_attrs_are_bound_once_and_arrays_become_backend_arrays():
    torch = pytest.importorskip("torch")
    from timerl.runtime.torch_backend import TorchBackend

    value = np.arange(6, dtype=np.float32).reshape(2, 3)
    op = apply("const", value=value).op
    call = prepare_call(op, TorchBackend(), seed=0)
    assert call.point_attrs == () and call.key is None
    assert isinstance(call.fn.keywords["value"], torch.Tensor)
    np.testing.assert_array_equal(call.fn().numpy(), value)
    (i, _) = _dims()
    x = apply("full", domain=(i,), shape=(Const(2), i + 1), value=1.0, dtype=np.dtype("float32"))
    call = prepare_call(apply("sum", x, axes=(1,)).op, NumpyBackend(), seed=0)
    assert call.fn.keywords == {"axes": (1,)} and call.point_attrs == ()


def test_host_op_gets_numpy_and_the_point_and_returns_backend_arrays():
    seen = []

    def fn(x, point):
        seen.append((type(x), point))
        return x * 2, x + 1

    (i, _) = _dims()
    x = apply("full", domain=(i,), shape=(Const(2),), value=1.0, dtype=np.dtype("float32"))
    op = apply("udf", x, fn=fn, shape=(), dtype=np.dtype(bool), pass_point=True).op
    call = prepare_call(op, NumpyBackend(), seed=0)
    assert call.pass_point and call.key is None
    a, b = call.fn(np.ones(2, dtype=np.float32), (4,))
    assert seen == [(np.ndarray, (4,))]
    np.testing.assert_array_equal(a, [2.0, 2.0])
    np.testing.assert_array_equal(b, [2.0, 2.0])


def test_piecewise_ops_have_no_kernel():
    ctx = tl.Context(dims=("t",))
    with ctx:
        x = tl.RecurrentTensor.placeholder((), domain=ctx.dims)
        x[0] = tl.zeros(())
    with pytest.raises(ValueError, match="piecewise"):
        prepare_call(x.view.op, NumpyBackend(), seed=0)


@pytest.mark.parametrize("backend", ["numpy", "torch"])
def test_the_reference_and_generated_code_call_ops_alike(backend):
    """Random keys (with key_at), point attributes and host calls with the point agree."""
    if backend == "torch":
        pytest.importorskip("torch")
    runs = []
    for compiled in (False, True):
        points: list = []
        ctx = tl.Context(dims=("i", "t"))
        (i, t), (I, T) = ctx.dims, ctx.bounds
        with ctx:
            x = tl.RecurrentTensor.placeholder((2,), domain=(i, t))
            x[i, 0] = tl.rand((2,), like=x, key_at=(i, 0))
            x[i, t + 1] = x[i, t] * 0.5 + tl.randn((2,), like=x)
            win = x[i, 0 : t + 1].sum(0)  # a point-dependent slice
            tl.sink(win, lambda v, p, out=points: out.append((p, np.asarray(v).copy())))
        prog = ctx.compile(bounds={I: 2, T: 4}, outputs=[x], backend=backend, seed=11)
        prog.run(compiled=compiled)
        runs.append((np.asarray(prog.value(x)), points))
    (ref, ref_points), (got, got_points) = runs
    np.testing.assert_array_equal(ref, got)
    assert [p for p, _ in ref_points] == [p for p, _ in got_points]
    assert all(type(v) is int for p, _ in got_points for v in p.values())
    for (_, a), (_, b) in zip(ref_points, got_points, strict=True):
        np.testing.assert_array_equal(a, b)


def test_an_empty_slice_of_a_tensor_whose_shape_changes_keeps_its_shape():
    # u[max(i - 1, 0):i + 1, t // 2] has i-dependent rows; its gradient sums an empty slice of
    # them at t = T - 1 (found by the differential fuzzer: the sum of an empty list was a scalar)
    import timerl as tl

    ctx = tl.Context(dims=("i", "t"))
    (i, t), (I, T) = ctx.dims, ctx.bounds
    u = np.array([[0.47772791709228524, -0.34390401801395853], [0.43792742255362005, 0.0133]])
    with ctx:
        u0 = tl.from_numpy(u, domain=(i, t), dtype="float64", requires_grad=True)
        x1 = tl.RecurrentTensor.placeholder((), dtype="float64", domain=(i, t))
        x1[t.eq(T - 1)] = u0[tl.max(i - 1, 0) : i + 1, t // 2].sum(0)
        x1[True] = x1[i, t + 1]
        ((x1 * x1).sum()).backward()
    want = tl.evaluate(u0.grad, bounds={I: 2, T: 2}, optimize=False)
    # by hand: x1[i, t] = sum of u[max(i-1,0):i+1, 0]; d/du[r, 0] = sum over (i, t) reading row r
    x = np.array([u[0, 0], u[0, 0] + u[1, 0]])
    by_hand = np.zeros_like(u)
    by_hand[0, 0] = 2 * (2 * x[0] + 2 * x[1])
    by_hand[1, 0] = 2 * 2 * x[1]
    np.testing.assert_allclose(want, by_hand)
    for backend in ("numpy", "torch"):
        np.testing.assert_allclose(tl.evaluate(u0.grad, bounds={I: 2, T: 2}, backend=backend), want)
