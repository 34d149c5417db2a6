"""Shared helpers for the core tests: contexts, backends and tolerant comparisons."""

from __future__ import annotations

import argparse

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


def counting(size: int):
    """``x[t]`` of shape ``(size,)`` counting up from zeros, in a context of its own (enter it
    again to define more): returns (ctx, t, T, x)."""
    ctx, t, big_t = ctx_t()
    with ctx:
        x = tl.RecurrentTensor.placeholder(shape=(size,), domain=(t,))
        x[0] = tl.zeros((size,))
        x[t + 1] = x[t] + 1.0
    return ctx, t, big_t, x


def until_program():
    """``x[i, t]`` counting up until it reaches ``i + 2`` (``ctx.until``: a loop whose extent is
    known only while it runs), and its sum: returns (ctx, {I: 3, T: 50}, [x, s])."""
    ctx, i, t, big_i, big_t = ctx_it()
    with ctx:
        x = tl.RecurrentTensor.placeholder((), domain=(i, t))
        x[i, 0] = tl.zeros(())
        x[i, t + 1] = x[i, t] + 1.0
        ctx.until(t, x >= tl.full((), i) + 2.0)
        s = x[i, 0:big_t].sum(0)
    return ctx, {big_i: 3, big_t: 50}, [x, s]


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


def against_reference(outputs, bounds, backend, rtol=1e-4, atol=1e-5):
    """Compile and run with every optimisation, compare each output with the unoptimised
    reference, and return the optimised program."""
    prog = outputs[0].ctx.compile(outputs=outputs, bounds=bounds, backend=backend)
    prog.run()
    want = tl.evaluate(outputs, bounds=bounds, backend=backend, optimize=False)
    for o, w in zip(outputs, want, strict=True):
        close(prog.value(o), w, rtol=rtol, atol=atol)
    return prog


def check_temporal_slice_gradient(kind, backend):
    """Gradient of sum_t c[t] * read(u, t)**2 for a temporal read ``kind``, against torch."""
    import torch

    def _arr(*shape, seed=0):
        return np.random.RandomState(seed).randn(*shape)

    n = 11
    u = _arr(n, 2, seed=11)
    c = _arr(n, 2, seed=12)

    def read(U, t, T):
        if kind == "suffix":
            return U[t:T].sum(0)
        if kind == "prefix":
            return U[0 : t + 1].sum(0)
        if kind == "window":
            return U[tl.max(t - 3, 0) : t + 1].mean(0)
        if kind == "lookahead":
            return U[tl.min(t + 5, T - 1)]
        return U[t : tl.min(t + 3, T)].sum(0)

    def read_torch(tu, k):
        if kind == "suffix":
            return tu[k:].sum(0)
        if kind == "prefix":
            return tu[: k + 1].sum(0)
        if kind == "window":
            return tu[max(k - 3, 0) : k + 1].mean(0)
        if kind == "lookahead":
            return tu[min(k + 5, n - 1)]
        return tu[k : min(k + 3, n)].sum(0)

    ctx, t, T = ctx_t()
    with ctx:
        U = tl.from_numpy(u, domain=(t,), requires_grad=True, dtype="float64")
        C = tl.from_numpy(c, domain=(t,), dtype="float64")
        r = read(U, t, T)
        loss = (r * r * C).sum()
        loss.backward()
        g, lv = tl.evaluate([U.grad, loss], backend=backend)
    tu = torch.tensor(u, requires_grad=True, dtype=torch.float64)
    tc = torch.tensor(c, dtype=torch.float64)
    tloss = sum((read_torch(tu, k) ** 2 * tc[k]).sum() for k in range(n))
    (want,) = torch.autograd.grad(tloss, [tu])
    close(lv, np.array([(read_torch(tu, k) ** 2 * tc[k]).sum().item() for k in range(n)]))
    close(g, want.numpy(), rtol=1e-6, atol=1e-9)


def rollout_beside_recurrence(vec):
    """A rollout over t of the env batch ``vec`` (obs of shape (n,), one action) whose loop also
    advances ``acc``, a recurrence that never reads the env: returns (ctx, reward, acc)."""
    from timerl.rl.envs.program import Env

    ctx, t, _ = ctx_t()
    with ctx:
        env = Env(vec)
        obs = tl.RecurrentTensor.placeholder(env.batch_obs_shape, "float32", (t,), name="obs")
        obs[0] = env.reset()
        action = (obs.sum(-1, keepdim=True) * np.float32(0.1)).tanh().named("action")
        acc = tl.RecurrentTensor.placeholder((8,), "float32", (t,), name="acc")
        acc[0] = tl.full((8,), 1.0)
        acc[t + 1] = (acc[t] * np.float32(0.5) + np.float32(1.0)).tanh()
        next_obs, reward, _ = env.step(action)
        obs[t + 1] = next_obs
    return ctx, reward, acc


def flags_hiding_defaults(parser) -> list[str]:
    """The flags of an argparse ``parser`` that have a default its ``--help`` does not show."""
    formatter = parser.formatter_class(prog=parser.prog)
    hidden = []
    for action in parser._actions:
        if not action.option_strings or action.default in (None, False, argparse.SUPPRESS):
            continue
        if action.help is None or "default:" not in formatter._get_help_string(action):
            hidden.append(action.option_strings[0])
    return hidden
