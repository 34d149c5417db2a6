"""Self-recurrences whose direction only holds where the branch reading them applies.

``x[t // 2]`` is not strictly before ``t`` at ``t = 0``, but the branch reading it runs only
where ``t >= 1`` (the base case takes ``t = 0``): the scheduler compares points under the
reader's guard, so these run as ordinary loops. An index whose direction cannot be proven
there (``x[(t + 1) % 3]``) is still refused, naming the read.
"""

from __future__ import annotations

import numpy as np
import pytest
from core_helpers import BACKENDS, close, ctx_t

import timerl as tl

MODES = [
    pytest.param(backend, optimize, id=f"{backend}-{'opt' if optimize else 'noopt'}")
    for backend in BACKENDS
    for optimize in (True, False)
]
N = 11


def _fd_grad(loss, a: np.ndarray, eps: float = 1e-6) -> np.ndarray:
    g = np.zeros_like(a)
    for k in range(len(a)):
        up, down = a.copy(), a.copy()
        up[k] += eps
        down[k] -= eps
        g[k] = (loss(up) - loss(down)) / (2 * eps)
    return g


def _halving(u: np.ndarray) -> np.ndarray:
    x = np.zeros(len(u))
    x[0] = 1.0
    for t in range(1, len(u)):
        x[t] = np.tanh(x[t // 2] + u[t])
    return x


@pytest.mark.parametrize("backend, optimize", MODES)
def test_reading_half_the_step(backend, optimize):
    u = np.random.RandomState(0).randn(N)
    ctx, t, big_t = ctx_t()
    with ctx:
        U = tl.from_numpy(u, domain=(t,), dtype="float64", requires_grad=True)
        x = tl.RecurrentTensor.placeholder((), "float64", domain=(t,))
        x[0] = 1.0
        x[True] = (x[t // 2] + U).tanh()
        (x * x).sum().backward()
        got, gu = tl.evaluate([x, U.grad], backend=backend, optimize=optimize)
    close(got, _halving(u), rtol=1e-12, atol=1e-12)
    close(gu, _fd_grad(lambda a: float((_halving(a) ** 2).sum()), u), rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("backend", BACKENDS)
def test_two_base_cases_before_a_division(backend):
    """``(t + 1) // 2 < t`` needs ``t >= 2``: the two base cases leave exactly that."""
    ctx, t, big_t = ctx_t()
    with ctx:
        x = tl.RecurrentTensor.placeholder((), "float64", domain=(t,))
        x[0] = 1.0
        x[1] = 2.0
        x[True] = x[(t + 1) // 2] * 0.5 + x[t - 1]
        got = tl.evaluate(x, bounds={big_t: N}, backend=backend)
    want = np.zeros(N)
    want[:2] = [1.0, 2.0]
    for k in range(2, N):
        want[k] = want[(k + 1) // 2] * 0.5 + want[k - 1]
    close(got, want, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("backend", BACKENDS)
def test_backward_recurrence_doubling_the_step(backend):
    """``r[min(2t + 1, T - 1)]`` is strictly after ``t`` wherever ``t < T - 1``."""
    ctx, t, big_t = ctx_t()
    with ctx:
        r = tl.RecurrentTensor.placeholder((), "float64", domain=(t,))
        r[big_t - 1] = 1.0
        r[True] = r[tl.min(2 * t + 1, big_t - 1)] * 0.5 + 1.0
        got = tl.evaluate(r, bounds={big_t: N}, backend=backend)
    want = np.zeros(N)
    want[N - 1] = 1.0
    for k in range(N - 2, -1, -1):
        want[k] = want[min(2 * k + 1, N - 1)] * 0.5 + 1.0
    close(got, want, rtol=1e-12, atol=1e-12)


def test_an_unprovable_direction_is_refused_naming_the_read():
    ctx, t, big_t = ctx_t()
    with ctx:
        x = tl.RecurrentTensor.placeholder((), "float64", domain=(t,))
        x[0] = 1.0
        x[True] = x[(t + 1) % 3] + 1.0
        with pytest.raises(
            tl.CycleError, match=r"% 3\)\] inside a recurrence over t: .*neither before nor after"
        ):
            tl.evaluate(x, bounds={big_t: 6})


def test_half_the_step_without_a_base_case_is_refused():
    """``x[t // 2]`` at ``t = 0`` is ``x[0]`` itself: with no base case that is a cycle."""
    ctx, t, big_t = ctx_t()
    with ctx:
        x = tl.RecurrentTensor.placeholder((), "float64", domain=(t,))
        x[True] = x[t // 2] + 1.0
        with pytest.raises(tl.CycleError, match="no base case"):
            tl.evaluate(x, bounds={big_t: 6})
