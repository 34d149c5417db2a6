"""Two classes of valid programs that once gave wrong values or failed, each checked against a
plain numpy loop written here.

- A value that shares its input's buffer (a spatial index ``u[1]`` is a view on numpy and
  torch) while a later op writes into that input in place: the index must see the old value.
- A branch whose points fall outside a bound (``x[i, 1] = ...`` under ``T = 1``, ``x[i + 2, t]``
  under ``I = 1``) defines no point: it reads nothing, contributes no gradient, and the program
  compiles and runs as if it were not written.
"""

from __future__ import annotations

import numpy as np
import pytest
from core_helpers import close, ctx_it, ctx_t

import timerl as tl


def _arr(*shape: int, seed: int) -> np.ndarray:
    return np.random.RandomState(seed).randn(*shape)


def _configs(backend: str) -> list[dict]:
    return [{"backend": backend}, {"backend": backend, "optimize": False}]


# --- a spatial index shares its input's buffer ---------------------------------------------------


def test_an_index_of_an_input_keeps_its_value_when_the_input_is_computed_with(backend):
    """``y[t] = u3[1]`` reads ``u3``'s buffer (a view); ``exp(u3 * 0.5)`` in the backward
    recurrence must not be written into that buffer while ``y`` still reads it."""
    u1, u3 = _arr(12, 3, seed=0), _arr(3, seed=1)
    ctx, t, T = ctx_t()
    with ctx:
        U1 = tl.from_numpy(u1, domain=(t,), dtype="float64")
        U3 = tl.from_numpy(u3, dtype="float64")
        y7 = tl.RecurrentTensor.placeholder((), "float64", domain=(t,))
        y7[t] = U3[1]
        y8 = tl.RecurrentTensor.placeholder((3,), "float64", domain=(t,))
        y8[t] = y7[0]
        y9 = tl.RecurrentTensor.placeholder((3,), "float64", domain=(t,))
        y9[T - 1] = U1[tl.min(t + 1, T - 1)]
        y9[t - 1] = tl.exp(U3 * 0.5) + y9 * (-0.645)  # a backward recurrence, shifted frame
        got9, got8 = tl.evaluate([y9, y8], bounds={T: 12}, backend=backend)
    want9 = np.zeros((12, 3))
    want9[11] = u1[11]
    for k in range(11, 0, -1):
        want9[k - 1] = np.exp(u3 * 0.5) + want9[k] * -0.645
    close(got8, np.full((12, 3), u3[1]), rtol=1e-12, atol=1e-12)
    close(got9, want9, rtol=1e-12, atol=1e-12)


def test_a_slice_of_an_input_keeps_its_values_on_numpy_too(backend):
    """Basic slicing is a view on numpy as well: ``u3[0:2]`` must survive ``u3 * 0.5``."""
    u3 = _arr(3, seed=2)
    ctx, t, T = ctx_t()
    with ctx:
        U3 = tl.from_numpy(u3, dtype="float64")
        y = tl.RecurrentTensor.placeholder((2,), "float64", domain=(t,))
        y[t] = U3[0:2]
        z = tl.RecurrentTensor.placeholder((3,), "float64", domain=(t,))
        z[T - 1] = U3 * 0.0
        z[t - 1] = tl.exp(U3 * 0.5) + z * 0.5
        got = tl.evaluate([y], bounds={T: 4}, backend=backend)[0]
    close(got, np.tile(u3[0:2], (4, 1)), rtol=0, atol=0)


def test_an_index_of_an_input_added_to_that_input(backend):
    """``u[2] + u`` writes into neither operand's buffer while the other shares it."""
    u = _arr(3, seed=3)
    ctx, i, t, I, T = ctx_it()
    with ctx:
        U = tl.from_numpy(u, dtype="float64")
        y = tl.RecurrentTensor.placeholder((3,), "float64", domain=(i, t))
        y[i, t] = U[2] + U
        got = tl.evaluate([y], bounds={I: 1, T: 2}, backend=backend)[0]
    close(got, np.broadcast_to(u[2] + u, (1, 2, 3)), rtol=0, atol=0)


def test_an_index_of_a_parameter_is_not_overwritten_by_its_gradient(backend):
    """Asking for a parameter's gradient (zeros here) must not write them into the parameter's
    buffer, which an index of it still reads."""
    u = _arr(2, seed=4)
    ctx, i, t, I, T = ctx_it()
    with ctx:
        U = tl.from_numpy(u, dtype="float64", requires_grad=True)
        y = tl.RecurrentTensor.placeholder((2,), "float64", domain=(i, t))
        y[i, t] = U[0]
        x = tl.RecurrentTensor.placeholder((), "float64", domain=(i, t))
        x[i, t] = 0.5
        (x * x).sum().backward()
        got_y, got_g = tl.evaluate([y, U.grad], bounds={I: 2, T: 3}, backend=backend)
    close(got_y, np.full((2, 3, 2), u[0]), rtol=0, atol=0)
    close(got_g, np.zeros(2), rtol=0, atol=0)


# --- branches with no point ---------------------------------------------------------------------


def test_a_branch_at_a_point_past_the_bound_is_empty(backend):
    u = _arr(1, 1, seed=5)
    ctx, i, t, I, T = ctx_it()
    with ctx:
        U = tl.from_numpy(u, domain=(i, t), dtype="float64")
        x = tl.RecurrentTensor.placeholder((), "float64", domain=(i, t))
        x[i, 0] = -0.526
        x[i, 1] = U
        for config in _configs(backend):
            close(tl.evaluate([x], bounds={I: 1, T: 1}, **config)[0], [[-0.526]], 0, 0)


def test_a_branch_beyond_the_bound_reads_nothing_and_is_not_rejected(backend):
    """``x[1, t]`` under ``I = 1`` reads ``p[0:i]`` and ``p[i // 3]`` at ``i = 1``, which does
    not exist: no read, no ``OutOfRangeError``."""
    p = _arr(1, 3, 2, seed=6)
    ctx, i, t, I, T = ctx_it()
    with ctx:
        P = tl.from_numpy(p, domain=(i,), dtype="float64")
        x = tl.RecurrentTensor.placeholder((), "float64", domain=(i, t))
        x[1, t] = P[0:i, 0].sum() + P[i // 3, 1].sum()
        x[True] = 1.5
        y = tl.RecurrentTensor.placeholder((), "float64", domain=(i, t))
        y[I - 3, t] = P[0:i, 0].sum()  # I - 3 is no point when I = 1
        y[True] = 0.5
        for config in _configs(backend):
            got_x, got_y = tl.evaluate([x, y], bounds={I: 1, T: 2}, **config)
            close(got_x, np.full((1, 2), 1.5), 0, 0)
            close(got_y, np.full((1, 2), 0.5), 0, 0)


def test_gradients_through_branches_past_the_bound(backend):
    """``x8[1, t] = u3[i]`` and ``x8[i + 2, t] = w5`` define nothing under ``I = 1``: the
    gradient of ``sum(x8 ** 2)`` is that of the first branch alone."""
    u3, w5 = _arr(1, seed=7), _arr(3, seed=8)
    ctx, i, t, I, T = ctx_it()
    with ctx:
        U3 = tl.from_numpy(u3, domain=(i,), dtype="float64", requires_grad=True)
        W5 = tl.from_numpy(w5, domain=(t,), dtype="float64", requires_grad=True)
        x8 = tl.RecurrentTensor.placeholder((), "float64", domain=(i, t))
        x8[0, t] = W5 * 2.0
        x8[1, t] = U3[i]
        x8[i + 2, t] = W5
        (x8**2).sum().backward()
        for config in _configs(backend):
            got_x, got_u, got_w = tl.evaluate([x8, U3.grad, W5.grad], bounds={I: 1, T: 3}, **config)
            close(got_x, (2.0 * w5)[None], rtol=1e-12, atol=0)
            close(got_u, np.zeros(1), 0, 0)
            close(got_w, 8.0 * w5, rtol=1e-12, atol=0)


@pytest.mark.parametrize("steps", [1, 2, 3])
def test_a_two_step_recurrence_over_one_or_two_points(backend, steps):
    """``x[1] = u[1] * w`` under ``T = 1`` reads ``u[1]``, which does not exist: neither its
    value nor the gradient through it may be computed."""
    u, w = _arr(steps, 3, seed=9), _arr(3, seed=10)
    ctx, t, T = ctx_t()
    with ctx:
        U = tl.from_numpy(u, domain=(t,), dtype="float64", requires_grad=True)
        W = tl.from_numpy(w, dtype="float64", requires_grad=True)
        x = tl.RecurrentTensor.placeholder((3,), "float64", domain=(t,))
        x[0] = U[0]
        x[1] = U[1] * W
        x[t + 2] = 0.5 * x[t + 1] + 0.3 * x[t]
        (x**2).sum().backward()
        want = np.zeros((steps, 3))
        want[0] = u[0]
        if steps > 1:
            want[1] = u[1] * w
        if steps > 2:
            want[2] = 0.5 * want[1] + 0.3 * want[0]
        gx = 2 * want  # d loss / d x, then back through the recurrence
        if steps > 2:
            gx[1] += 0.5 * gx[2]
            gx[0] += 0.3 * gx[2]
        gu = np.zeros((steps, 3))
        gu[0] = gx[0]
        gw = np.zeros(3)
        if steps > 1:
            gu[1] = gx[1] * w
            gw = gx[1] * u[1]
        for config in _configs(backend):
            got_x, got_u, got_w = tl.evaluate([x, U.grad, W.grad], bounds={T: steps}, **config)
            close(got_x, want, rtol=1e-12, atol=1e-12)
            close(got_u, gu, rtol=1e-12, atol=1e-12)
            close(got_w, gw, rtol=1e-12, atol=1e-12)


# --- a number written to a spatial recurrence -----------------------------------------------------


@pytest.mark.parametrize("bounds", [(2, 3), (1, 1)])
@pytest.mark.parametrize("base", ["number", "tensor"])
def test_a_number_as_the_base_of_a_spatial_linear_recurrence(backend, bounds, base):
    """``x[t.eq(0)] = 0.5`` broadcasts to ``x``'s shape ``(3,)``; the scan that replaces the
    recurrence must too (it took the base's shape ``()``: a raw error, or with no step a
    result of the wrong shape)."""
    n_i, n_t = bounds
    u = np.abs(_arr(n_i, n_t, 3, seed=11))
    ctx, i, t, I, T = ctx_it()
    with ctx:
        U = tl.from_numpy(u, domain=(i, t), dtype="float64")
        x = tl.RecurrentTensor.placeholder((3,), "float64", domain=(i, t))
        x[t.eq(0)] = 0.5 if base == "number" else U.sum(-1) * 0.0 + 0.5
        x[True] = U + x[i, t - 1] * U
        want = np.zeros((n_i, n_t, 3))
        want[:, 0] = 0.5
        for k in range(1, n_t):
            want[:, k] = u[:, k] + want[:, k - 1] * u[:, k]
        for config in _configs(backend):
            got = tl.evaluate(x, bounds={I: n_i, T: n_t}, **config)
            assert got.shape == want.shape, config
            close(got, want, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("episodes", [2, 3])
def test_a_branch_at_one_episode_reads_its_own_points_under_until(backend, episodes):
    """``p[2, t] = u[i, t]`` with lengths set per ``i`` by ``ctx.until``: the branch reads
    episode 2's own points (its condition pins ``i == 2``), so it is no read of another
    episode's points; under ``I = 2`` it applies to no point at all."""
    u = _arr(episodes, 4, seed=5)
    stop = np.zeros((episodes, 4))
    stop[0, 2] = stop[1, 3] = 1.0  # episode 0 ends after t = 2, the others run to T = 4
    ctx, i, t, I, T = ctx_it()
    with ctx:
        U = tl.from_numpy(u, domain=(i, t), dtype="float64")
        p = tl.RecurrentTensor.placeholder((), "float64", domain=(i, t))
        p[2, t] = U[i, t]
        p[i, t] = U[i, tl.max(t - 1, 0)]
        ctx.until(t, tl.from_numpy(stop, domain=(i, t)) > 0.5)
    lengths = [3, 4, 4][:episodes]
    for cfg in _configs(backend):
        got = tl.evaluate(p, bounds={I: episodes, T: 4}, **cfg)
        for k, n in enumerate(lengths):
            want = u[k, :n] if k == 2 else u[k, np.maximum(np.arange(n) - 1, 0)]
            close(got[k], want)
