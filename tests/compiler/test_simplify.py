"""Simplification rules, each alone: the matmul of a gather becomes one take_matmul."""

from __future__ import annotations

import numpy as np

import timerl as tl
from timerl.compiler.dce import eliminate_dead_code
from timerl.compiler.simplify import Lookup, matmul_of_gather, simplify
from timerl.compiler.spec import freeze
from timerl.ir import rowwise


def _spec(ctx, outputs):
    static, dynamic = ctx.resolve_bounds({"U": 3})
    return freeze([], [o.op for o in outputs], ctx.dims, ctx._until, static, dynamic)


def _program(seed: int = 0):
    rng = np.random.default_rng(seed)
    xv = rng.normal(size=(12, 5)).astype(np.float32)
    wv = rng.normal(size=(5, 4)).astype(np.float32)
    perms = np.stack([rng.permutation(12)[:6] for _ in range(3)])
    ctx = tl.Context(dims=("u",))
    (u,) = ctx.dims
    with ctx:
        x = tl.from_numpy(xv)
        w = tl.from_numpy(wv, requires_grad=True)
        idx = tl.from_numpy(perms, domain=(u,))
        y = (x.take(idx) @ w).tanh()
        loss = (y * y).sum()
        loss.backward(inputs=[w])
        outs = [loss, w.grad]
    return ctx, outs, (xv, wv, perms)


def test_rule_rewrites_the_forward_product_and_the_weight_gradient(monkeypatch):
    monkeypatch.setattr(rowwise, "CHUNK_BYTES", 16)  # the rule fires for gathers above a chunk
    ctx, outs, _ = _program()
    spec = eliminate_dead_code(_spec(ctx, outs))
    lookup = Lookup()
    fired = {}
    for op in spec.ops:
        new = matmul_of_gather(op, lookup)
        if op.prim != "matmul":
            assert new is None
        elif new is not None:
            fired[op.id] = new.attrs["trans"]
    assert sorted(fired.values()) == [False, True]  # x[idx] @ w and x[idx].T @ g
    simple = simplify(spec)
    left = [op.prim for op in simple.ops]
    assert left.count("take_matmul") == 2
    assert "take" not in left  # the gathered minibatch is no longer built


def test_rule_declines_a_matmul_of_anything_else():
    ctx = tl.Context(dims=("u",))
    with ctx:
        a = tl.from_numpy(np.ones((3, 4), dtype=np.float32))
        b = tl.from_numpy(np.ones((4, 2), dtype=np.float32))
        out = (a.T @ a) @ (a.T @ (a @ b))
    spec = eliminate_dead_code(_spec(ctx, [out]))
    assert all(matmul_of_gather(op, Lookup()) is None for op in spec.ops)


def test_rewritten_program_equals_the_unoptimised_reference_values_and_gradients():
    ctx, outs, (xv, wv, perms) = _program(1)
    got = tl.evaluate(outs, bounds={"U": 3})
    want = tl.evaluate(outs, bounds={"U": 3}, optimize=False)
    for g, r in zip(got, want, strict=True):
        np.testing.assert_allclose(g, r, rtol=1e-5, atol=1e-6)
    # and against numpy, by hand, at u = 2
    y = np.tanh(xv[perms[2]] @ wv)
    np.testing.assert_allclose(got[0][-1] if np.ndim(got[0]) else got[0], (y * y).sum(), rtol=1e-5)
