"""Duplicate code elimination merges ops that compute the same values, and nothing else."""

from __future__ import annotations

import numpy as np
from core_helpers import ctx_t

import timerl as tl


def test_duplicate_expressions_are_computed_once(backend):
    u = np.random.RandomState(0).randn(6, 3)
    ctx, t, T = ctx_t()
    with ctx:
        U = tl.from_numpy(u, domain=(t,))
        a = (U[0:T].reshape((-1,)) * 2.0).tanh()  # the same expression built twice
        b = (U[0:T].reshape((-1,)) * 2.0).tanh()
        out = a + b
    once = ctx.compile(bounds={T: 6}, outputs=[out], backend=backend)
    with ctx:
        single = (U[0:T].reshape((-1,)) * 2.0).tanh() * 2.0
    reference = ctx.compile(bounds={T: 6}, outputs=[single], backend=backend)
    assert once.stats()["ops"] == reference.stats()["ops"]
    assert "duplicate ops merged" in once.explain()
    got = tl.evaluate(out, bounds={T: 6}, backend=backend)
    np.testing.assert_allclose(got, 2 * np.tanh(u.reshape(-1) * 2.0), rtol=1e-5)


def test_random_draws_are_never_merged():
    ctx, t, T = ctx_t()
    with ctx:
        x = tl.randn((4,))
        y = tl.randn((4,))
        d = x - y
    got = tl.evaluate(d, bounds={T: 3})
    assert np.all(np.abs(got) > 0)


def test_duplicates_inside_a_recurrence_are_merged(backend):
    ctx, t, T = ctx_t()
    with ctx:
        h = tl.RecurrentTensor.placeholder((2,), domain=(t,), dtype="float64")
        h[0] = tl.from_numpy(np.array([0.5, -0.25]))
        h[t + 1] = (h * 0.9).tanh() + (h * 0.9).tanh()
    prog = ctx.compile(bounds={T: 8}, outputs=[h], backend=backend)
    assert "duplicate ops merged" in prog.explain()
    got = tl.evaluate(h, bounds={T: 8}, backend=backend)
    want = [np.array([0.5, -0.25])]
    for _ in range(7):
        want.append(2 * np.tanh(want[-1] * 0.9))
    np.testing.assert_allclose(got, np.stack(want), rtol=1e-12)
