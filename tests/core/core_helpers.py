"""Shared helpers for the core tests: contexts, backends and tolerant comparisons."""

from __future__ import annotations

import numpy as np

import timerl as tl

BACKENDS = ["numpy", "torch"]


def ctx_t():
    """A context with the single dim ``t``: returns (ctx, t, T)."""
    ctx = tl.Context(dims=("t",))
    return ctx, ctx.dims[0], ctx.bounds[0]


def ctx_it():
    """A context with dims ``(i, t)``: returns (ctx, i, t, I, T)."""
    ctx = tl.Context(dims=("i", "t"))
    (i, t), (big_i, big_t) = ctx.dims, ctx.bounds
    return ctx, i, t, big_i, big_t


def close(got, want, rtol=1e-5, atol=1e-5):
    """Compare arrays (or nested lists of arrays, for ragged values)."""
    if isinstance(want, (list, tuple)):
        assert isinstance(got, (list, tuple, np.ndarray)), type(got)
        assert len(got) == len(want)
        for g, w in zip(got, want, strict=True):
            close(g, w, rtol, atol)
        return
    got = np.asarray(got)
    want = np.asarray(want)
    assert got.shape == want.shape, (got.shape, want.shape)
    np.testing.assert_allclose(
        got.astype(np.float64), want.astype(np.float64), rtol=rtol, atol=atol
    )
