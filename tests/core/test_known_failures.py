"""Programs the contract says must work but the core gets wrong today.

Each test is a real check against an independent reference; the strict xfail keeps the failure
visible and turns into an error the moment the core is fixed (then remove the mark).
"""

from __future__ import annotations

import numpy as np
import pytest
from core_helpers import check_temporal_slice_gradient, ctx_t

import timerl as tl


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
    reason="BoundError 'bound T is not known here': gradient ops of a ctx.until loop read T "
    "inside that loop (ir/autodiff.py + schedule place the backward pass in the dynamic loop)",
)
def test_gradient_through_data_dependent_episode_length(backend):
    ctx, t, T = ctx_t()
    with ctx:
        a = tl.from_numpy(np.array(1.5), requires_grad=True, dtype="float64")
        x = tl.RecurrentTensor.placeholder((), dtype="float64", domain=(t,))
        x[0] = 1.0
        x[t + 1] = x * a
        ctx.until(t, x > 10.0)
        loss = x[0:T].sum(0)
        loss.backward()
        gx, ga = tl.evaluate([x, a.grad], bounds={T: 100}, backend=backend)
    # x = a^k for k = 0..6 (1.5^6 > 10 is the first to pass); d/da sum a^k = sum k a^(k-1)
    n = len(gx)
    assert n == 7
    np.testing.assert_allclose(ga, sum(k * 1.5 ** (k - 1) for k in range(n)), rtol=1e-9)


@pytest.mark.xfail(
    strict=True,
    reason="DESIGN section 2: an optimiser update that does not detach must be reported as a "
    "cycle; today backward() snapshots the graph and the update compiles silently",
)
def test_update_without_detach_is_reported():
    ctx = tl.Context(dims=("i",))
    (i,), (I,) = ctx.dims, ctx.bounds
    with ctx:
        w = tl.RecurrentTensor.placeholder((), domain=(i,), requires_grad=True, name="w")
        w[0] = 1.0
        (w * w).backward()
        w[i + 1] = w - 0.1 * w.grad
    with pytest.raises(tl.CycleError):
        ctx.compile(bounds={I: 4}, outputs=[w])


@pytest.mark.xfail(
    strict=True,
    reason="ir/autodiff.py builds a branch value op's VJP over the op's whole domain: for "
    "x[t+1] = x * u[t+1] the VJP reads u[t+1] at t=T-1 and validation reports OutOfRangeError",
)
@pytest.mark.parametrize("variant", ["mul_next_input", "tanh_next_input", "product_of_reads"])
def test_gradient_of_recurrence_reading_next_input(variant, backend):
    import torch

    u = np.random.RandomState(40).randn(6)
    ctx, t, T = ctx_t()
    with ctx:
        U = tl.from_numpy(u, domain=(t,), requires_grad=True, dtype="float64")
        x = tl.RecurrentTensor.placeholder((), dtype="float64", domain=(t,))
        x[0] = U[0]
        if variant == "mul_next_input":
            x[t + 1] = x * U[t + 1]
        elif variant == "tanh_next_input":
            x[t + 1] = (x * 0.7 + U[t + 1]).tanh()
        else:
            x[t + 1] = x + U[t + 1] * U[t]
        x.backward()
        got = tl.evaluate(U.grad, backend=backend)
    tu = torch.tensor(u, requires_grad=True)
    xs = [tu[0]]
    for k in range(5):
        if variant == "mul_next_input":
            xs.append(xs[-1] * tu[k + 1])
        elif variant == "tanh_next_input":
            xs.append(torch.tanh(xs[-1] * 0.7 + tu[k + 1]))
        else:
            xs.append(xs[-1] + tu[k + 1] * tu[k])
    (want,) = torch.autograd.grad(sum(xs), [tu])
    np.testing.assert_allclose(got, want.numpy(), rtol=1e-9, atol=1e-12)


@pytest.mark.xfail(
    strict=True,
    reason="runtime/backends.py torch lowering ignores the inferred dtype: int64 (op) float32 "
    "and int64 / 2 are declared float64 (numpy rules) but the torch backend returns float32",
)
def test_torch_values_have_the_declared_dtype():
    ctx, t, T = ctx_t()
    with ctx:
        a = tl.from_numpy(np.arange(3.0, dtype=np.float32), domain=(t,))
        c = tl.from_numpy(np.arange(3, dtype=np.int64), domain=(t,))
        results = [a + c, c / 2, c * 2.5]
    got = tl.evaluate(results, backend="torch")
    for r, v in zip(results, got, strict=True):
        assert v.dtype == r.dtype, (r, v.dtype)
