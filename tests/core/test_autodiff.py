"""Gradients against torch.autograd on the same program written unrolled and eagerly."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from core_helpers import check_temporal_slice_gradient, close, ctx_it, ctx_t
from hypothesis import given, settings
from hypothesis import strategies as st

import timerl as tl


@pytest.fixture(autouse=True)
def _float64_torch():
    """The eager references compute in float64, like the timerl programs they check."""
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    yield
    torch.set_default_dtype(previous)


def _arr(*shape, seed=0, scale=1.0):
    return np.random.RandomState(seed).randn(*shape) * scale


def _tl_grads(fn, arrays, ints=(), backend="numpy"):
    """Gradients of ``fn(tl, *leaves, *ints)`` w.r.t. each float array (domain-less leaves)."""
    ctx, t, T = ctx_t()
    with ctx:
        leaves = [tl.from_numpy(a, requires_grad=True, dtype="float64") for a in arrays]
        extra = [tl.from_numpy(k) for k in ints]
        loss = fn(tl, *leaves, *extra)
        loss.backward()
        return tl.evaluate([leaf.grad for leaf in leaves] + [loss], backend=backend)


def _torch_grads(fn, arrays, ints=()):
    leaves = [torch.tensor(a, requires_grad=True) for a in arrays]
    extra = [torch.tensor(k) for k in ints]
    loss = fn(torch, *leaves, *extra)
    grads = torch.autograd.grad(loss, leaves)
    return [g.numpy() for g in grads] + [loss.detach().numpy()]


A34 = [(3, 4), (3, 4)]
SPATIAL_CASES = {
    "add": (A34 + [(4,)], lambda M, a, b, c: ((a + b) * c).sum()),
    "sub_pow_const": (A34, lambda M, a, b: ((a - b) ** 2).sum()),
    "mul_neg": (A34, lambda M, a, b: (-a * b).sum()),
    "div": (A34, lambda M, a, b: (a / (b * b + 1.0)).sum()),
    "pow_tensor": (A34, lambda M, a, b: ((a * a + 0.5) ** b).sum()),
    "exp": ([(3, 4)], lambda M, a: (a * 0.5).exp().sum()),
    "log": ([(3, 4)], lambda M, a: (a * a + 0.1).log().sum()),
    "tanh": (A34, lambda M, a, b: (a.tanh() * b).sum()),
    "sigmoid": (A34, lambda M, a, b: (a.sigmoid() * b).sum()),
    "sqrt": (A34, lambda M, a, b: ((a * a + 1.0).sqrt() * b).sum()),
    "abs": (A34, lambda M, a, b: (a.abs() * b).sum()),
    "relu": (A34, lambda M, a, b: (a.relu() * b).sum()),
    "maximum": (A34, lambda M, a, b: (M.maximum(a, b) * (a + 2.0)).sum()),
    "where": (A34, lambda M, a, b: M.where(a > b, a * 2.0, b * b).sum()),
    "sum_dim": (A34, lambda M, a, b: (a.sum(0) * b.sum(1).sum()).sum() + (a.sum(1) ** 2).sum()),
    "mean": (A34, lambda M, a, b: (a.mean(1) * b.mean(1)).sum() + a.mean() * b.mean()),
    "amax": (A34, lambda M, a, b: (a.amax(1) * b.amax(1)).sum() + (a * b).amax()),
    "matmul": ([(3, 4), (5, 4), (5,)], lambda M, a, b, c: ((a @ b.T).tanh() @ c).sum()),
    "matvec": ([(3, 4), (4,)], lambda M, a, c: (a @ c).tanh().sum()),
    "reshape": ([(3, 4), (2,)], lambda M, a, c: ((a.reshape(6, 2) @ c) ** 2).sum()),
    "permute_transpose": (
        A34,
        lambda M, a, b: (a.permute(1, 0) * b.transpose(0, 1) * a.T).sum(),
    ),
    "unsqueeze_expand": (
        A34,
        lambda M, a, b: ((a.sum(0).unsqueeze(0).expand(3, 4) * b) ** 2).sum(),
    ),
    "getitem": (A34, lambda M, a, b: (a[1:, :2] * b[:2, 1:3]).sum() + a[0, 3] * b[2, 0]),
    "cat": (
        A34,
        lambda M, a, b: (M.cat([a, b * 2.0], 0) ** 2).sum() + M.cat([a, b], 1)[:, 5].sum(),
    ),
    "stack": (A34, lambda M, a, b: (M.stack([a, b], 0).sum(0) ** 2).sum()),
    "softmax": (A34, lambda M, a, b: (a.softmax(-1) * b).sum()),
    "log_softmax": (A34, lambda M, a, b: (a.log_softmax(-1) * b).sum()),
    "logsumexp": (A34, lambda M, a, b: (a.logsumexp(1) * b.sum(1)).sum()),
}


@pytest.mark.parametrize("case", sorted(SPATIAL_CASES))
def test_spatial_primitive_gradients_match_torch(case, backend):
    shapes, fn = SPATIAL_CASES[case]
    arrays = [_arr(*s, seed=k + 3) for k, s in enumerate(shapes)]
    got = _tl_grads(fn, arrays, backend=backend)
    want = _torch_grads(fn, arrays)
    for g, w in zip(got, want, strict=True):
        close(g, w, rtol=1e-6, atol=1e-8)


def test_gather_gradient_matches_torch(backend):
    a = _arr(3, 5, seed=1)
    b = _arr(3, 2, seed=2)
    idx = np.array([[0, 4], [2, 2], [1, 3]], dtype=np.int64)

    def fn(M, a, b, idx):
        return (a.gather(1, idx) * b).sum()

    got = _tl_grads(fn, [a, b], [idx], backend)
    want = _torch_grads(fn, [a, b], [idx])
    for g, w in zip(got, want, strict=True):
        close(g, w, rtol=1e-6, atol=1e-8)


# --- temporal gradients -------------------------------------------------------------------------


def _leaf_t(arr, t):
    return tl.from_numpy(arr, domain=(t,), requires_grad=True, dtype="float64")


def test_rnn_gradients_through_25_steps(backend):
    steps = 25
    u = _arr(steps, 3, seed=4)
    w = _arr(4, 4, seed=5, scale=0.5)
    v = _arr(4, 3, seed=6, scale=0.5)
    h0 = _arr(4, seed=7)
    ctx, t, T = ctx_t()
    with ctx:
        U = _leaf_t(u, t)
        W = tl.from_numpy(w, requires_grad=True, dtype="float64")
        V = tl.from_numpy(v, requires_grad=True, dtype="float64")
        H0 = tl.from_numpy(h0, requires_grad=True, dtype="float64")
        h = tl.RecurrentTensor.placeholder((4,), dtype="float64", domain=(t,))
        h[0] = H0
        h[t + 1] = (W @ h[t] + V @ U[t]).tanh()
        loss = (h * h).sum() * 0.5  # a loss over t: summed over its points
        loss.backward()
        got = tl.evaluate([U.grad, W.grad, V.grad, H0.grad], backend=backend)

    tu, tw, tv, th0 = (torch.tensor(a, requires_grad=True) for a in (u, w, v, h0))
    hs = [th0]
    for k in range(steps - 1):
        hs.append(torch.tanh(tw @ hs[-1] + tv @ tu[k]))
    tloss = sum((x * x).sum() * 0.5 for x in hs)
    want = torch.autograd.grad(tloss, [tu, tw, tv, th0])
    for g, wnt in zip(got, want, strict=True):
        close(g, wnt.numpy(), rtol=1e-6, atol=1e-9)
    # the last input never reaches the loss
    close(got[0][-1], np.zeros(3))


def test_full_slice_sum_gradient_is_one_not_T(backend):
    u = _arr(12, 2, seed=8)
    ctx, t, T = ctx_t()
    with ctx:
        U = _leaf_t(u, t)
        total = U[0:T].sum(0).sum()
        total.backward()
        (g,) = tl.evaluate([U.grad], backend=backend)
    close(g, np.ones_like(u))


def test_full_slice_inside_a_nonlinear_loss(backend):
    u = _arr(10, seed=9)
    c = _arr(10, seed=10)
    ctx, t, T = ctx_t()
    with ctx:
        U = _leaf_t(u, t)
        C = tl.from_numpy(c, domain=(t,), dtype="float64")
        loss = U[0:T].sum(0).tanh() * C * U  # every point reads the total
        loss.backward()
        g = tl.evaluate(U.grad, backend=backend)
    tu = torch.tensor(u, requires_grad=True)
    (want,) = torch.autograd.grad((torch.tanh(tu.sum()) * torch.tensor(c) * tu).sum(), [tu])
    close(g, want.numpy(), rtol=1e-6, atol=1e-9)


@pytest.mark.parametrize("kind", ["suffix", "prefix"])
def test_temporal_slice_gradients(kind, backend):
    check_temporal_slice_gradient(kind, backend)


def test_backward_recurrence_gradient(backend):
    """ret[t] = r[t] + g * ret[t+1]; loss = sum_t c[t] * ret[t]."""
    n, gam = 14, 0.9
    r = _arr(n, seed=13)
    c = _arr(n, seed=14)
    ctx, t, T = ctx_t()
    with ctx:
        R = _leaf_t(r, t)
        C = tl.from_numpy(c, domain=(t,), dtype="float64")
        ret = tl.RecurrentTensor.placeholder((), dtype="float64", domain=(t,))
        ret[T - 1] = R[T - 1]
        ret[True] = R[t] + gam * ret[t + 1]
        loss = ret * C
        loss.backward()
        g = tl.evaluate(R.grad, backend=backend)
    tr = torch.tensor(r, requires_grad=True)
    rets = [None] * n
    acc = torch.zeros(())
    for k in reversed(range(n)):
        acc = tr[k] + gam * acc
        rets[k] = acc
    (want,) = torch.autograd.grad(sum(rk * ck for rk, ck in zip(rets, c, strict=True)), [tr])
    close(g, want.numpy(), rtol=1e-6, atol=1e-9)


def test_detach_stops_gradient_through_the_recurrence(backend):
    n = 10
    u = _arr(n, seed=15)
    ctx, t, T = ctx_t()
    with ctx:
        U = _leaf_t(u, t)
        x = tl.RecurrentTensor.placeholder((), dtype="float64", domain=(t,))
        x[0] = U[0]
        x[t + 1] = x[t].detach() * 0.5 + U[t + 1] * U[t + 1]
        y = tl.RecurrentTensor.placeholder((), dtype="float64", domain=(t,))
        y[0] = U[0]
        y[t + 1] = y[t] * 0.5 + U[t + 1] * U[t + 1]
        x.backward()
        gx = tl.evaluate(U.grad, backend=backend)
    # with detach only the direct path remains: d x[k] / d u[k]
    close(gx, np.concatenate([[1.0], 2 * u[1:]]))
    tu = torch.tensor(u, requires_grad=True)
    ys = [tu[0]]
    for k in range(n - 1):
        ys.append(ys[-1] * 0.5 + tu[k + 1] ** 2)
    (full,) = torch.autograd.grad(sum(ys), [tu])
    assert not np.allclose(gx, full.numpy())  # the detach really changed something


def test_gradient_matches_finite_differences(backend):
    n = 8
    u = _arr(n, 2, seed=16)
    w = _arr(2, 2, seed=17, scale=0.6)

    def build(u_arr, w_arr):
        ctx, t, T = ctx_t()
        with ctx:
            U = _leaf_t(u_arr, t)
            W = tl.from_numpy(w_arr, requires_grad=True, dtype="float64")
            h = tl.RecurrentTensor.placeholder((2,), dtype="float64", domain=(t,))
            h[0] = tl.zeros((2,), dtype="float64")
            h[t + 1] = (W @ h + U[t]).sigmoid()
            loss = h[0:T].sum(0).log().sum() + h[t:T].mean(0).sum()
        return U, W, loss

    U, W, loss = build(u, w)
    loss.backward()
    gu, gw = tl.evaluate([U.grad, W.grad], backend=backend)

    def value(u_arr, w_arr):
        _, _, ls = build(u_arr, w_arr)
        return float(np.sum(tl.evaluate(ls, backend=backend)))

    eps = 1e-6
    for arr, grad in ((u, gu), (w, gw)):
        for idx in np.ndindex(arr.shape):
            plus, minus = arr.copy(), arr.copy()
            plus[idx] += eps
            minus[idx] -= eps
            args_p = (plus, w) if arr is u else (u, plus)
            args_m = (minus, w) if arr is u else (u, minus)
            fd = (value(*args_p) - value(*args_m)) / (2 * eps)
            assert abs(fd - grad[idx]) < 1e-5 * max(1.0, abs(fd)), (idx, fd, grad[idx])


def test_grad_of_unused_leaf_is_zero_over_its_domain(backend):
    ctx, t, T = ctx_t()
    with ctx:
        a = _leaf_t(_arr(5, 2, seed=18), t)
        b = _leaf_t(_arr(5, 2, seed=19), t)
        loss = (a * a).sum()
        loss.backward()
        ga, gb = tl.evaluate([a.grad, b.grad], backend=backend)
    close(ga, 2 * _arr(5, 2, seed=18))
    close(gb, np.zeros((5, 2)))


def test_sgd_grad_at_each_iteration_is_gradient_of_that_loss(backend):
    xs = _arr(10, 2, seed=20)
    ys = _arr(10, seed=21)
    steps, lr = 8, 0.2
    ctx = tl.Context(dims=("i",))
    (i,), (I,) = ctx.dims, ctx.bounds
    with ctx:
        X, Y = tl.from_numpy(xs, dtype="float64"), tl.from_numpy(ys, dtype="float64")
        w = tl.RecurrentTensor.placeholder((2,), dtype="float64", domain=(i,), requires_grad=True)
        w[0] = tl.ones((2,), dtype="float64")
        loss = ((X @ w - Y).tanh() ** 2).mean()
        loss.backward()
        tl.optim.SGD([w], lr=lr).step()
        gw, gg, gl = tl.evaluate([w, w.grad, loss], bounds={I: steps}, backend=backend)
    tx, ty = torch.tensor(xs), torch.tensor(ys)
    wk = torch.ones(2, requires_grad=True)
    for k in range(steps):
        lk = ((tx @ wk - ty).tanh() ** 2).mean()
        (gk,) = torch.autograd.grad(lk, [wk])
        close(gw[k], wk.detach().numpy(), rtol=1e-6, atol=1e-9)
        close(gg[k], gk.numpy(), rtol=1e-6, atol=1e-9)
        close(gl[k], lk.item(), rtol=1e-6, atol=1e-9)
        wk = (wk - lr * gk).detach().requires_grad_(True)


def test_gradient_through_nested_inner_rollouts(backend):
    """Per-iteration parameter p[i] drives an inner rollout; loss[i] = sum of the rollout."""
    ctx = tl.Context(dims=("i", "t"))
    (i, t), (_, T) = ctx.dims, ctx.bounds
    p0 = _arr(3, seed=22)
    with ctx:
        P = tl.from_numpy(p0, domain=(i,), requires_grad=True, dtype="float64")
        h = tl.RecurrentTensor.placeholder((), dtype="float64", domain=(i, t))
        h[i, 0] = P[i]
        h[i, t + 1] = (h[i, t] * P[i]).tanh() + 0.1
        loss = h[i, 0:T].sum(0) ** 2
        loss.backward()
        g = tl.evaluate(P.grad, bounds={T: 6}, backend=backend)
    tp = torch.tensor(p0, requires_grad=True)
    total = 0
    for a in range(3):
        hs = [tp[a]]
        for _ in range(5):
            hs.append(torch.tanh(hs[-1] * tp[a]) + 0.1)
        total = total + sum(hs) ** 2
    (want,) = torch.autograd.grad(total, [tp])
    close(g, want.numpy(), rtol=1e-6, atol=1e-9)


def test_sgd_on_a_loss_averaged_over_time(backend):
    """loss[i] = mean_t (w[i] * r[t] - 1)^2 over a temporal slice; w.grad[i] checked each step."""
    r = np.arange(4.0)
    lr, steps = 0.05, 6
    ctx, i, t, I, T = ctx_it()
    with ctx:
        w = tl.RecurrentTensor.placeholder((), dtype="float64", domain=(i,), requires_grad=True)
        w[0] = 1.0
        R = tl.from_numpy(r, domain=(t,), dtype="float64")
        loss = ((w * R - 1.0) ** 2)[i, 0:T].mean(0)
        loss.backward()
        tl.optim.SGD([w], lr=lr).step()
        gw, gg, gl = tl.evaluate([w, w.grad, loss], bounds={I: steps}, backend=backend)
    wk = 1.0
    for k in range(steps):
        close(gw[k], wk)
        close(gl[k], np.mean((wk * r - 1.0) ** 2))
        grad = np.mean(2 * (wk * r - 1.0) * r)
        close(gg[k], grad)
        wk -= lr * grad


def _torch_leaf(arr):
    return torch.tensor(arr, requires_grad=True)


def test_gradient_through_attention_over_the_prefix(backend):
    u = _arr(6, 3, seed=30)
    ctx, t, T = ctx_t()
    with ctx:
        U = _leaf_t(u, t)
        hist = U[0 : t + 1]
        out = (hist @ U[t]).softmax(-1) @ hist
        loss = (out * out).sum()
        loss.backward()
        g = tl.evaluate(U.grad, backend=backend)
    tu = _torch_leaf(u)
    total = 0
    for k in range(6):
        o = torch.softmax(tu[: k + 1] @ tu[k], -1) @ tu[: k + 1]
        total = total + (o * o).sum()
    (want,) = torch.autograd.grad(total, [tu])
    close(g, want.numpy(), rtol=1e-6, atol=1e-9)


def test_gradient_through_cat_of_temporal_slices(backend):
    u = _arr(5, seed=31)
    ctx, t, T = ctx_t()
    with ctx:
        U = _leaf_t(u, t)
        c = tl.cat([U[0 : t + 1], U[t:T] * 2.0], 0)
        loss = (c * c).sum(0).sqrt()
        loss.backward()
        g = tl.evaluate(U.grad, backend=backend)
    tu = _torch_leaf(u)
    total = 0
    for k in range(5):
        c = torch.cat([tu[: k + 1], tu[k:] * 2.0])
        total = total + (c * c).sum().sqrt()
    (want,) = torch.autograd.grad(total, [tu])
    close(g, want.numpy(), rtol=1e-6, atol=1e-9)


def test_gradient_through_constant_index_reads(backend):
    u = _arr(5, seed=32)
    ctx, t, T = ctx_t()
    with ctx:
        U = _leaf_t(u, t)
        loss = (U - U[0]) * U[T - 1] + U[2]
        loss.backward()
        g = tl.evaluate(U.grad, backend=backend)
    tu = _torch_leaf(u)
    total = sum((tu[k] - tu[0]) * tu[4] + tu[2] for k in range(5))
    (want,) = torch.autograd.grad(total, [tu])
    close(g, want.numpy(), rtol=1e-9, atol=1e-12)


def test_gradient_through_dynamic_max_and_mean(backend):
    u = _arr(6, 2, seed=33)
    ctx, t, T = ctx_t()
    with ctx:
        U = _leaf_t(u, t)
        loss = (U[t:T].amax(0) * U[0 : t + 1].mean(0)).sum()
        loss.backward()
        g = tl.evaluate(U.grad, backend=backend)
    tu = _torch_leaf(u)
    total = sum((tu[k:].amax(0) * tu[: k + 1].mean(0)).sum() for k in range(6))
    (want,) = torch.autograd.grad(total, [tu])
    close(g, want.numpy(), rtol=1e-9, atol=1e-12)


def test_gradient_through_nested_full_slices(backend):
    u = _arr(3, 4, seed=34)
    ctx, i, t, I, T = ctx_it()
    with ctx:
        U = tl.from_numpy(u, domain=(i, t), requires_grad=True, dtype="float64")
        s = U[i, 0:T].sum(0)
        tot = s[0:I].sum(0)
        loss = tot * tot + s[I - 1]
        loss.backward()
        g = tl.evaluate(U.grad, backend=backend)
    want = 2 * u.sum() * np.ones_like(u)
    want[-1] += 1.0
    close(g, want, rtol=1e-9, atol=1e-12)


# --- random recurrence programs -----------------------------------------------------------------

GRAD_READS = ["now", "prefix", "suffix", "full", "first", "last"]
POINTWISE = ("now", "prefix", "suffix")  # reads that keep the dim t


def _tl_read(U, kind, t, T):
    return {
        "now": lambda: U[t],
        "prefix": lambda: U[0 : t + 1].sum(0),
        "suffix": lambda: U[t:T].sum(0),
        "full": lambda: U[0:T].mean(0),
        "first": lambda: U[0],
        "last": lambda: U[T - 1],
    }[kind]()


def _torch_read(u, kind, p):
    return {
        "now": lambda: u[p],
        "prefix": lambda: u[: p + 1].sum(0),
        "suffix": lambda: u[p:].sum(0),
        "full": lambda: u.mean(0),
        "first": lambda: u[0],
        "last": lambda: u[-1],
    }[kind]()


@settings(max_examples=20, deadline=None)
@given(
    n=st.integers(2, 7),
    kind=st.sampled_from(GRAD_READS),
    out=st.sampled_from(GRAD_READS),
    mode=st.sampled_from(["lin", "tanh", "mul"]),
    backend=st.sampled_from(["numpy", "torch"]),
    seed=st.integers(0, 100),
)
def test_random_recurrence_gradients(n, kind, out, mode, backend, seed):
    """x[t+1] = f(x[t], read(u)); loss = read'(x)^2 (summed over t where it has t)."""
    u = np.random.RandomState(seed).randn(n) * 0.5
    ctx, t, T = ctx_t()
    with ctx:
        U = _leaf_t(u, t)
        x = tl.RecurrentTensor.placeholder((), dtype="float64", domain=(t,))
        x[0] = U[0]
        r = _tl_read(U, kind, t, T)
        body = {"lin": x * 0.7 + r * 1.3, "tanh": (x * 0.7 + r).tanh(), "mul": x * r}[mode]
        x[t + 1] = body
        y = _tl_read(x, out, t, T)
        (y * y).backward()
        g = tl.evaluate(U.grad, backend=backend)
    tu = _torch_leaf(u)
    xs = [tu[0]]
    for p in range(n - 1):
        rr = _torch_read(tu, kind, p)
        prev = xs[-1]
        xs.append(
            {"lin": prev * 0.7 + rr * 1.3, "tanh": torch.tanh(prev * 0.7 + rr), "mul": prev * rr}[
                mode
            ]
        )
    xt = torch.stack(xs)
    if out in POINTWISE:
        total = sum(_torch_read(xt, out, p) ** 2 for p in range(n))
    else:
        total = _torch_read(xt, out, 0) ** 2
    (want,) = torch.autograd.grad(total, [tu])
    close(g, want.numpy(), rtol=1e-7, atol=1e-9)


def test_index_add_sums_rows_at_their_index_and_its_gradient_is_take():
    rows = np.arange(12, dtype=np.float32).reshape(4, 3)
    index = np.array([1, 1, 3, 0])
    want = np.zeros((5, 3), dtype=np.float32)
    np.add.at(want, index, rows)
    with tl.Context(dims=("i",)) as ctx:
        (i,) = ctx.dims
        w = tl.RecurrentTensor.placeholder((4, 3), domain=(i,), requires_grad=True, name="w")
        w[0] = tl.from_numpy(rows)
        w[i + 1] = w[i].detach()
        summed = w[i].index_add(tl.from_numpy(index), 5)
        weights = tl.from_numpy(np.arange(15, dtype=np.float32).reshape(5, 3))
        (summed * weights).sum().backward(inputs=[w])
        got, grad = tl.evaluate([summed, w.grad], bounds={"I": 1})
    np.testing.assert_array_equal(got[0], want)
    np.testing.assert_array_equal(grad[0], np.arange(15, dtype=np.float32).reshape(5, 3)[index])
