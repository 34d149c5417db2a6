"""Programs the contract says must work but the core gets wrong today.

Each test is a real check against an independent reference; the strict xfail keeps the failure
visible and turns into an error the moment the core is fixed (then remove the mark).
"""

from __future__ import annotations

import numpy as np
import pytest
from core_helpers import check_temporal_slice_gradient, ctx_t

import timerl as tl
from timerl.symbolic import Dim, max_, min_


@pytest.mark.xfail(
    strict=True,
    reason="scheduler.py direction analysis judges each edge alone: f[t+2] = f[t+1] + f[t] "
    "reads t+1 (later) in the value op, but composed with the branch shift t-2 the read is t-1",
)
def test_second_order_recurrence_fibonacci(backend):
    ctx, t, T = ctx_t()
    with ctx:
        f = tl.RecurrentTensor.placeholder((), dtype="int64", domain=(t,))
        f[0] = 0
        f[1] = 1
        f[t + 2] = f[t + 1] + f[t]
    got = tl.evaluate(f, bounds={T: 15}, backend=backend)
    want = [0, 1]
    for _ in range(13):
        want.append(want[-1] + want[-2])
    np.testing.assert_array_equal(got, want)


@pytest.mark.xfail(
    strict=True,
    reason="schedule/liveness.py keeps every point of x when only "
    "x[T-1] is read after the loop: peak grows linearly with T",
)
def test_last_point_reader_memory_does_not_grow(backend):
    def peak(steps):
        ctx, t, T = ctx_t()
        seen = []
        with ctx:
            x = tl.RecurrentTensor.placeholder((256,), domain=(t,))
            x[0] = tl.zeros((256,))
            x[t + 1] = x[t] * 0.5 + 1.0
            tl.sink(x[T - 1].sum(), lambda value, point: seen.append(float(value)))
        prog = ctx.compile(bounds={T: steps}, backend=backend)
        prog.run()
        assert seen and abs(seen[0] - 256 * (2 - 2 ** (2 - steps))) < 1e-2
        return prog.stats()["peak_bytes"]

    short, long = peak(50), peak(500)
    assert long <= short * 1.1 + 1024, (short, long)


@pytest.mark.xfail(
    strict=True,
    reason="expr.py _minmax flattens nested min/max before comparing, "
    "so min(m, m + 1) with m = min(0, T) is not simplified to m",
)
def test_min_of_expression_and_its_successor_simplifies():
    t = Dim("t")
    m = min_(0, t.bound)
    assert min_(m, m + 1) == m
    assert max_(max_(0, t), max_(0, t) + 1) == max_(0, t) + 1


@pytest.mark.xfail(
    strict=True,
    reason="ir/autodiff.py transposes only reads that move one step per step (t+k, 0:t+1, t:T); "
    "clamped reads max(t-3,0):t+1, min(t+5,T-1), t:min(t+3,T) raise ProgramError",
)
@pytest.mark.parametrize("kind", ["window", "lookahead", "lookahead_window"])
def test_gradient_through_clamped_temporal_reads(kind, backend):
    check_temporal_slice_gradient(kind, backend)


@pytest.mark.xfail(
    strict=True,
    reason="ir/prims.py expand's torch lowering calls x.expand(*shape) with shape=() for a 0-d "
    "target: TypeError; hit by backward() of .sum() over a scalar",
)
def test_torch_backward_of_scalar_sum():
    ctx, t, T = ctx_t()
    with ctx:
        u = tl.from_numpy(np.arange(4.0), domain=(t,), requires_grad=True, dtype="float64")
        loss = (u * u).sum()  # u is 0-d at each point: sum over no axes
        loss.backward()
        g = tl.evaluate(u.grad, backend="torch")
    np.testing.assert_allclose(g, 2 * np.arange(4.0))


@pytest.mark.xfail(
    strict=True, reason="api/tensor.py: RecurrentTensor has no .pow method (PyTorch has)"
)
def test_pow_method_mirrors_pytorch(backend):
    ctx, t, T = ctx_t()
    with ctx:
        u = tl.from_numpy(np.arange(5.0), domain=(t,))
        got = tl.evaluate(u.pow(3), backend=backend)
    np.testing.assert_allclose(got, np.arange(5.0) ** 3)
