"""Recurrences the written loop order cannot run, checked against plain numpy loops.

``x[i, t + 1] = f(x[I - 1, t])`` over dims ``(i, t)``: each step over ``t`` reads other points of
``i`` at the previous step, so the loop over ``i`` has to run inside the loop over ``t``. A
target network's base case ``tgt[0] = w[0].detach()`` has no dim ``i`` but lies in the cycle
through the parameter's update, so it is pinned into that loop at ``i = 0``. Both used to be
refused with a ``CycleError``; programs that really are cyclic still are.
"""

from __future__ import annotations

import numpy as np
import pytest
from core_helpers import BACKENDS, close, ctx_it, ctx_t

import timerl as tl
from timerl.api.optim import SGD
from timerl.schedule.program import Loop

MODES = [
    pytest.param(backend, optimize, id=f"{backend}-{'opt' if optimize else 'noopt'}")
    for backend in BACKENDS
    for optimize in (True, False)
]

N_I, N_T = 3, 5


def _arr(*shape: int, seed: int) -> np.ndarray:
    return np.random.RandomState(seed).randn(*shape)


def _fd_grad(loss, a: np.ndarray, eps: float = 1e-6) -> np.ndarray:
    """d loss(a) / d a by central differences (float64: accurate to ~1e-8)."""
    g = np.zeros_like(a)
    for pos in np.ndindex(a.shape):
        up, down = a.copy(), a.copy()
        up[pos] += eps
        down[pos] -= eps
        g[pos] = (loss(up) - loss(down)) / (2 * eps)
    return g


# --- a recurrence over t reading across i at the previous step ----------------------------------


def _step(kind: str, prev: np.ndarray, k: int) -> float:
    """The value ``x[k, t + 1]`` reads from ``prev = x[:, t]``."""
    n = len(prev)
    if kind == "last":
        return prev[n - 1]
    if kind == "sum":
        return prev.sum() * 0.3
    return prev[min(k + 1, n - 1)] - prev[max(k - 1, 0)] * 0.5  # "neighbours"


def _reference(kind: str, a: np.ndarray, u: np.ndarray) -> np.ndarray:
    n_i, n_t = u.shape
    x = np.zeros((n_i, n_t))
    x[:, 0] = a
    for t in range(n_t - 1):
        for k in range(n_i):
            x[k, t + 1] = np.tanh(_step(kind, x[:, t], k) + u[k, t])
    return x


def _build(kind: str, i, t, big_i, A, U):
    x = tl.RecurrentTensor.placeholder((), "float64", domain=(i, t), name="x")
    x[i, 0] = A
    if kind == "last":
        prev = x[big_i - 1, t]
    elif kind == "sum":
        prev = x[0:big_i, t].sum(0) * 0.3
    else:
        prev = x[tl.min(i + 1, big_i - 1), t] - x[tl.max(i - 1, 0), t] * 0.5
    x[i, t + 1] = (prev + U[i, t]).tanh()
    return x


@pytest.mark.parametrize("kind", ["last", "sum", "neighbours"])
@pytest.mark.parametrize("backend, optimize", MODES)
def test_recurrence_over_t_reading_across_i(kind, backend, optimize):
    a, u = _arr(N_I, seed=1), _arr(N_I, N_T, seed=2)
    ctx, i, t, big_i, big_t = ctx_it()
    with ctx:
        A = tl.from_numpy(a, domain=(i,), dtype="float64", requires_grad=True)
        U = tl.from_numpy(u, domain=(i, t), dtype="float64", requires_grad=True)
        x = _build(kind, i, t, big_i, A, U)
        (x * x).sum().backward()
        got, ga, gu = tl.evaluate(
            [x, A.grad, U.grad], bounds={big_t: N_T}, backend=backend, optimize=optimize
        )
    close(got, _reference(kind, a, u), rtol=1e-12, atol=1e-12)

    def loss_a(a2):
        return float((_reference(kind, a2, u) ** 2).sum())

    def loss_u(u2):
        return float((_reference(kind, a, u2) ** 2).sum())

    close(ga, _fd_grad(loss_a, a), rtol=1e-6, atol=1e-7)
    close(gu, _fd_grad(loss_u, u), rtol=1e-6, atol=1e-7)


def test_the_loop_over_i_runs_inside_the_loop_over_t():
    """Reading ``x[i + 1, t]`` and ``x[i - 1, t]`` fixes no direction over ``i``; the written
    order (``i`` outer) is kept where it works (``x[I - 1, t]`` alone: ``i`` runs backward)."""
    ctx, i, t, big_i, big_t = ctx_it()
    with ctx:
        A = tl.from_numpy(_arr(N_I, seed=1), domain=(i,), dtype="float64")
        U = tl.from_numpy(_arr(N_I, N_T, seed=2), domain=(i, t), dtype="float64")
        crossing = _build("neighbours", i, t, big_i, A, U)
        last = _build("last", i, t, big_i, A, U)
        nested = ctx.compile(outputs=[crossing], bounds={big_t: N_T}).schedule
        written = ctx.compile(outputs=[last], bounds={big_t: N_T}).schedule
    (t_loop,) = [s for s in nested.body if isinstance(s, Loop) and s.dim is t]
    assert [s.dim for s in t_loop.body if isinstance(s, Loop)] == [i, i]
    assert all(s.dim is i for s in written.body if isinstance(s, Loop))
    (i_loop,) = [s for s in written.body if isinstance(s, Loop)]
    assert not i_loop.forward


@pytest.mark.parametrize("backend", BACKENDS)
def test_dims_written_time_first(backend):
    """The same recurrence over dims ``(t, i)``: the written order already works."""
    a, u = _arr(N_I, seed=3), _arr(N_I, N_T, seed=4)
    ctx = tl.Context(dims=("t", "i"))
    (t, i), (big_t, big_i) = ctx.dims, ctx.bounds
    with ctx:
        A = tl.from_numpy(a, domain=(i,), dtype="float64")
        U = tl.from_numpy(u.T.copy(), domain=(t, i), dtype="float64")
        x = tl.RecurrentTensor.placeholder((), "float64", domain=(t, i))
        x[0, i] = A
        x[t + 1, i] = (x[t, big_i - 1] + U[t, i]).tanh()
        got = tl.evaluate(x, bounds={big_t: N_T}, backend=backend)
    close(got, _reference("last", a, u).T, rtol=1e-12, atol=1e-12)


# --- a target network --------------------------------------------------------------------------


def _target_reference(n: int, w0: float, lr: float):
    w, tgt = [w0], [0.2 * w0]
    for k in range(n - 1):
        w.append(w[k] - lr * 2 * (w[k] - tgt[k]))
        tgt.append(0.5 * tgt[k] + 0.5 * w[k])
    w, tgt = np.array(w), np.array(tgt)
    return w, tgt, 2 * (w - tgt)


@pytest.mark.parametrize("backend, optimize", MODES)
def test_target_network_tracking_a_trained_parameter(backend, optimize):
    """``tgt[0] = w[0].detach() * 0.2`` has no dim ``i``: it runs in the loop at ``i = 0``."""
    n = 6
    ctx = tl.Context(dims=("i",))
    (i,), (big_i,) = ctx.dims, ctx.bounds
    with ctx:
        w = tl.RecurrentTensor.placeholder((), "float64", domain=(i,), requires_grad=True)
        w[0] = 1.5
        tgt = tl.RecurrentTensor.placeholder((), "float64", domain=(i,))
        tgt[0] = w[0].detach() * 0.2
        tgt[i + 1] = tgt[i] * 0.5 + w[i].detach() * 0.5
        ((w - tgt.detach()) ** 2).backward()
        SGD([w], lr=0.1).step()
        got = tl.evaluate([w, tgt, w.grad], bounds={big_i: n}, backend=backend, optimize=optimize)
    for g, want in zip(got, _target_reference(n, 1.5, 0.1), strict=True):
        close(g, want, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("backend", BACKENDS)
def test_target_network_over_a_given_tensor(backend):
    w0 = _arr(5, seed=5)
    ctx = tl.Context(dims=("i",))
    (i,), _ = ctx.dims, ctx.bounds
    with ctx:
        w = tl.from_numpy(w0, domain=(i,), dtype="float64", requires_grad=True)
        tgt = tl.RecurrentTensor.placeholder((), "float64", domain=(i,))
        tgt[0] = w[0].detach()
        tgt[i + 1] = tgt[i] * 0.5 + w[i].detach() * 0.5
        ((w - tgt.detach()) ** 2).sum().backward()
        got_t, got_g = tl.evaluate([tgt, w.grad], backend=backend)
    want_t = np.zeros(5)
    want_t[0] = w0[0]
    for k in range(4):
        want_t[k + 1] = 0.5 * want_t[k] + 0.5 * w0[k]
    close(got_t, want_t, rtol=1e-12, atol=1e-12)
    close(got_g, 2 * (w0 - want_t), rtol=1e-12, atol=1e-12)


# --- still refused -----------------------------------------------------------------------------


def test_a_cycle_at_one_point_across_i_is_still_refused():
    """``x[i, t + 1]`` reads ``x[I - 1, t + 1]``, its own step: no loop order runs it."""
    ctx, i, t, big_i, big_t = ctx_it()
    with ctx:
        x = tl.RecurrentTensor.placeholder((), "float64", domain=(i, t))
        x[i, 0] = 1.0
        x[i, t + 1] = x[big_i - 1, t + 1] + x[i, t]
        with pytest.raises(tl.CycleError, match="no base case"):
            tl.evaluate(x, bounds={big_i: 3, big_t: 4})


def test_reading_both_directions_is_still_refused():
    ctx, t, big_t = ctx_t()
    with ctx:
        x = tl.RecurrentTensor.placeholder((), "float64", domain=(t,))
        x[0] = 1.0
        x[big_t - 1] = 2.0
        x[True] = x[t - 1] + x[t + 1]
        with pytest.raises(tl.CycleError, match="earlier and later"):
            tl.evaluate(x, bounds={big_t: 5})


def test_a_value_needing_itself_is_still_refused():
    ctx, t, big_t = ctx_t()
    with ctx:
        x = tl.RecurrentTensor.placeholder((), "float64", domain=(t,))
        x[True] = x[t] + 1.0
        with pytest.raises(tl.CycleError, match="no base case"):
            tl.evaluate(x, bounds={big_t: 3})


def test_an_op_reading_a_recurrence_at_two_points_is_not_pinned():
    """``w[0] + w[I - 1]`` feeds ``tgt`` at every step: there is no one point to run it at."""
    ctx = tl.Context(dims=("i",))
    (i,), (big_i,) = ctx.dims, ctx.bounds
    with ctx:
        w = tl.RecurrentTensor.placeholder((), "float64", domain=(i,))
        w[0] = 1.0
        both = w[0] + w[big_i - 1]
        w[i + 1] = w[i] * 0.5 + both
        with pytest.raises(tl.CycleError, match="with and without dim i"):
            tl.evaluate(w, bounds={big_i: 4})


# --- two recurrences needing different loop orders --------------------------------------------


def _two_orders_reference(a: float, u: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    n_i, n_t = u.shape
    x1 = np.zeros((n_i, n_t))
    for k in range(n_i):
        x1[k, 0] = a if k == 0 else np.tanh(x1[k - 1, n_t - 1] * 0.5 + 0.3)
        for t in range(n_t - 1):
            x1[k, t + 1] = np.tanh(x1[k, t] * 0.5 + u[k, t])
    x3 = np.zeros((n_i, n_t))
    x3[:, 0] = [x1[k % 2, 0] for k in range(n_i)]
    for t in range(n_t - 1):
        x3[:, t + 1] = np.tanh(x3[:, t].sum() * 0.3 + x3[:, t] * 0.5)
    return x1, x3


@pytest.mark.parametrize("backend, optimize", MODES)
def test_recurrences_needing_different_loop_orders(backend, optimize):
    """``x1`` carries over ``i`` (``i`` outer), ``x3`` reads across ``i`` (``t`` outer): all of
    ``x1`` runs first, then ``x3``."""
    u = _arr(N_I, N_T, seed=6)
    ctx, i, t, big_i, big_t = ctx_it()
    with ctx:
        U = tl.from_numpy(u, domain=(i, t), dtype="float64")
        x1 = tl.RecurrentTensor.placeholder((), "float64", domain=(i, t))
        x1[0, 0] = 0.7
        x1[i + 1, 0] = (x1[i, big_t - 1] * 0.5 + 0.3).tanh()
        x1[i, t + 1] = (x1[i, t] * 0.5 + U[i, t]).tanh()
        x3 = tl.RecurrentTensor.placeholder((), "float64", domain=(i, t))
        x3[i, 0] = x1[i % 2, 0]
        x3[i, t + 1] = (x3[0:big_i, t].sum(0) * 0.3 + x3[i, t] * 0.5).tanh()
        got = tl.evaluate([x1, x3], bounds={big_t: N_T}, backend=backend, optimize=optimize)
    for g, want in zip(got, _two_orders_reference(0.7, u), strict=True):
        close(g, want, rtol=1e-12, atol=1e-12)
