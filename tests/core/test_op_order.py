"""Loop-body blocks are reordered (by graphopt's memory-aware list scheduling) when that lowers
their peak memory, and the values do not change."""

from __future__ import annotations

import numpy as np
from core_helpers import ctx_t

import timerl as tl
import timerl.compiler.order as order

# These programs are small loop bodies over t that vectorisation would batch into one op each
# (no loop left to order): keep them point by point to test the op order itself.
POINT_BY_POINT = tl.CompileOptions(vectorize=False)


def _program():
    u = np.random.RandomState(0).randn(6, 4000)
    ctx, t, T = ctx_t()
    with ctx:
        x = tl.from_numpy(u, domain=(t,), dtype="float64")
        big = [(x * float(k + 1)).tanh() for k in range(4)]  # written first, all at once
        total = big[0].sum() + big[1].sum() + big[2].sum() + big[3].sum()
    return ctx, T, total, u


def _run(backend):
    ctx, T, total, u = _program()
    prog = ctx.compile(bounds={T: 6}, outputs=[total], backend=backend, options=POINT_BY_POINT)
    prog.run()
    return prog, np.asarray(prog.value(total)), u


def test_reordering_lowers_the_peak_and_keeps_values(backend, monkeypatch):
    prog, got, u = _run(backend)
    assert any("reordered" in n for n in prog.report.notes)
    want = sum(np.tanh(u * (k + 1)).sum(axis=1) for k in range(4))
    np.testing.assert_allclose(got, want, rtol=1e-10)

    monkeypatch.setattr(order, "MIN_BLOCK", 10**9)  # as written
    written, same, _ = _run(backend)
    np.testing.assert_array_equal(same, got)
    row = 4000 * 8
    # as written, the four tanh rows of a point are alive together; reordered, fewer
    assert written.stats()["peak_bytes"] - prog.stats()["peak_bytes"] > 1.5 * row
