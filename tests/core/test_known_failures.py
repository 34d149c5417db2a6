"""Programs the contract says must work but the core gets wrong today.

Each test is a real check against an independent reference; the strict xfail keeps the failure
visible and turns into an error the moment the core is fixed (then remove the mark).
"""

from __future__ import annotations

import numpy as np
import pytest
from core_helpers import ctx_t

import timerl as tl


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
