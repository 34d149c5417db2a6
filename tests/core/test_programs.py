"""Differential tests: recurrent-tensor programs against plain numpy loops, on every backend."""

from __future__ import annotations

import numpy as np
import pytest
from core_helpers import close, ctx_it, ctx_t
from hypothesis import given, settings
from hypothesis import strategies as st

import timerl as tl


def _f32(*shape, scale=1.0, seed=0):
    return (np.random.RandomState(seed).randn(*shape) * scale).astype(np.float32)


# --- forward recurrences ------------------------------------------------------------------------


def test_scalar_affine_recurrence(backend):
    ctx, t, T = ctx_t()
    with ctx:
        x = tl.RecurrentTensor.placeholder((), domain=(t,))
        x[0] = 1.0
        x[t + 1] = x[t] * 0.9 + 0.1
    got = tl.evaluate(x, bounds={T: 30}, backend=backend)
    want = np.zeros(30)
    want[0] = 1.0
    for k in range(29):
        want[k + 1] = want[k] * 0.9 + 0.1
    close(got, want)


def test_contract_example_vector_recurrence(backend):
    ctx, t, T = ctx_t()
    with ctx:
        x = tl.RecurrentTensor.placeholder(shape=(3,), dtype="float32", domain=(t,))
        x[0] = tl.zeros((3,))
        x[t + 1] = x[t] * 0.5 + 1.0
        total = x[0:T].sum(0)
        prefix = x[0 : t + 1].mean(0)
        future = x[t:T].sum(0)
    got_x, got_total, got_prefix, got_future = tl.evaluate(
        [x, total, prefix, future], bounds={T: 10}, backend=backend
    )
    want = np.zeros((10, 3))
    for k in range(9):
        want[k + 1] = want[k] * 0.5 + 1.0
    close(got_x, want)
    close(got_total, want.sum(0))
    close(got_prefix, np.stack([want[: k + 1].mean(0) for k in range(10)]))
    close(got_future, np.stack([want[k:].sum(0) for k in range(10)]))


def test_matrix_affine_recurrence(backend):
    a = _f32(4, 4, scale=0.4, seed=1)
    b = _f32(4, seed=2)
    ctx, t, T = ctx_t()
    with ctx:
        A, B = tl.from_numpy(a), tl.from_numpy(b)
        x = tl.RecurrentTensor.placeholder((4,), domain=(t,))
        x[0] = tl.ones((4,))
        x[t + 1] = A @ x + B
    got = tl.evaluate(x, bounds={T: 15}, backend=backend)
    want = [np.ones(4, np.float32)]
    for _ in range(14):
        want.append(a @ want[-1] + b)
    close(got, np.stack(want), rtol=1e-4, atol=1e-4)


def test_tanh_rnn_driven_by_inputs(backend):
    u = _f32(12, 3, seed=3)
    w = _f32(5, 5, scale=0.5, seed=4)
    uw = _f32(5, 3, scale=0.5, seed=5)
    ctx, t, T = ctx_t()
    with ctx:
        U = tl.from_numpy(u, domain=(t,))
        W, UW = tl.from_numpy(w), tl.from_numpy(uw)
        h = tl.RecurrentTensor.placeholder((5,), domain=(t,))
        h[0] = tl.zeros((5,))
        h[t + 1] = (W @ h[t] + UW @ U[t]).tanh()
    got = tl.evaluate(h, backend=backend)  # T fixed by the input array
    want = np.zeros((12, 5), np.float32)
    for k in range(11):
        want[k + 1] = np.tanh(w @ want[k] + uw @ u[k])
    close(got, want, rtol=1e-4, atol=1e-5)


def test_logistic_map_nonlinear(backend):
    ctx, t, T = ctx_t()
    with ctx:
        x = tl.RecurrentTensor.placeholder((), dtype="float64", domain=(t,))
        x[0] = 0.2
        x[t + 1] = 3.7 * x * (1.0 - x)
    got = tl.evaluate(x, bounds={T: 25}, backend=backend)
    want = [0.2]
    for _ in range(24):
        want.append(3.7 * want[-1] * (1 - want[-1]))
    close(got, np.array(want), rtol=1e-9, atol=1e-9)


def test_cumulative_sum_recurrence_and_prefix_slice_agree(backend):
    u = _f32(20, seed=6)
    ctx, t, T = ctx_t()
    with ctx:
        U = tl.from_numpy(u, domain=(t,))
        c = tl.RecurrentTensor.placeholder((), domain=(t,))
        c[0] = U[0]
        c[t + 1] = c[t] + U[t + 1]
        p = U[0 : t + 1].sum(0)
    got_c, got_p = tl.evaluate([c, p], backend=backend)
    close(got_c, np.cumsum(u), rtol=1e-4, atol=1e-4)
    close(got_p, np.cumsum(u), rtol=1e-4, atol=1e-4)


def test_integer_counter_recurrence(backend):
    ctx, t, T = ctx_t()
    with ctx:
        n = tl.RecurrentTensor.placeholder((), dtype="int64", domain=(t,))
        n[0] = 3
        n[t + 1] = n * 2 + 1
    got = tl.evaluate(n, bounds={T: 12}, backend=backend)
    want = [3]
    for _ in range(11):
        want.append(want[-1] * 2 + 1)
    assert np.asarray(got).dtype.kind == "i"
    np.testing.assert_array_equal(got, want)


def test_where_inside_recurrence(backend):
    ctx, t, T = ctx_t()
    with ctx:
        x = tl.RecurrentTensor.placeholder((), domain=(t,))
        x[0] = 0.0
        x[t + 1] = tl.where(x > 1.0, x - 1.0, x + 0.7)
    got = tl.evaluate(x, bounds={T: 30}, backend=backend)
    want = [np.float32(0.0)]
    for _ in range(29):
        v = want[-1]
        want.append(np.float32(v - 1.0) if v > 1.0 else np.float32(v + np.float32(0.7)))
    close(got, np.array(want), rtol=1e-5, atol=1e-5)


def test_mutually_recursive_tensors(backend):
    u = _f32(16, seed=7)
    ctx, t, T = ctx_t()
    with ctx:
        U = tl.from_numpy(u, domain=(t,))
        a = tl.RecurrentTensor.placeholder((), domain=(t,))
        b = tl.RecurrentTensor.placeholder((), domain=(t,))
        a[0] = 1.0
        b[0] = 0.0
        a[t + 1] = 0.5 * a + 0.3 * b
        b[t + 1] = 0.2 * a - 0.9 * b + U[t]
    ga, gb = tl.evaluate([a, b], backend=backend)
    wa, wb = [1.0], [0.0]
    for k in range(15):
        wa.append(0.5 * wa[k] + 0.3 * wb[k])
        wb.append(0.2 * wa[k] - 0.9 * wb[k] + u[k])
    close(ga, np.array(wa), rtol=1e-4, atol=1e-5)
    close(gb, np.array(wb), rtol=1e-4, atol=1e-5)


def test_last_point_and_constant_index_reads(backend):
    ctx, t, T = ctx_t()
    with ctx:
        x = tl.RecurrentTensor.placeholder((2,), domain=(t,))
        x[0] = tl.ones((2,))
        x[t + 1] = x * 1.1
        last = x[T - 1]
        first = x[0]
        ratio = x / x[0]  # x over t divided by the (domain-less) first point
    gl, gf, gr = tl.evaluate([last, first, ratio], bounds={T: 8}, backend=backend)
    want = np.stack([np.ones(2) * 1.1**k for k in range(8)])
    close(gl, want[-1], rtol=1e-5)
    close(gf, want[0])
    close(gr, want / want[0], rtol=1e-5)


# --- temporal slices, windows, look-ahead ---------------------------------------------------------


def test_suffix_and_total_sums_of_inputs(backend):
    u = _f32(9, 2, seed=8)
    ctx, t, T = ctx_t()
    with ctx:
        U = tl.from_numpy(u, domain=(t,))
        suffix = U[t:T].sum(0)
        total = U[0:T].sum(0)
        suffix_max = U[t:T].amax(0)
    gs, gt, gm = tl.evaluate([suffix, total, suffix_max], backend=backend)
    close(gs, np.stack([u[k:].sum(0) for k in range(9)]), rtol=1e-5, atol=1e-5)
    close(gt, u.sum(0), rtol=1e-5, atol=1e-5)
    close(gm, np.stack([u[k:].max(0) for k in range(9)]))


def test_prefix_mean_and_ragged_values(backend):
    u = _f32(7, 3, seed=9)
    ctx, t, T = ctx_t()
    with ctx:
        U = tl.from_numpy(u, domain=(t,))
        hist = U[0 : t + 1]
        mean = hist.mean(0)
    gh, gm = tl.evaluate([hist, mean], backend=backend)
    assert isinstance(gh, list) and len(gh) == 7
    close(gh, [u[: k + 1] for k in range(7)])
    close(gm, np.stack([u[: k + 1].mean(0) for k in range(7)]), rtol=1e-5, atol=1e-6)


def test_trailing_window_sum_and_mean(backend):
    u = _f32(15, seed=10)
    ctx, t, T = ctx_t()
    with ctx:
        U = tl.from_numpy(u, domain=(t,))
        win = U[tl.max(t - 3, 0) : t + 1]
        s = win.sum(0)
        m = win.mean(0)
    gs, gm = tl.evaluate([s, m], backend=backend)
    close(gs, np.array([u[max(k - 3, 0) : k + 1].sum() for k in range(15)]), rtol=1e-5, atol=1e-5)
    close(gm, np.array([u[max(k - 3, 0) : k + 1].mean() for k in range(15)]), rtol=1e-5, atol=1e-5)


def test_window_over_a_recurrence(backend):
    ctx, t, T = ctx_t()
    with ctx:
        x = tl.RecurrentTensor.placeholder((), domain=(t,))
        x[0] = 1.0
        x[t + 1] = x * 0.8 + 0.5
        avg = x[tl.max(t - 2, 0) : t + 1].mean(0)
    gx, ga = tl.evaluate([x, avg], bounds={T: 12}, backend=backend)
    want = [1.0]
    for _ in range(11):
        want.append(want[-1] * 0.8 + 0.5)
    want = np.array(want)
    close(gx, want)
    close(ga, np.array([want[max(k - 2, 0) : k + 1].mean() for k in range(12)]), rtol=1e-5)


def test_clamped_lookahead_reads(backend):
    u = _f32(11, seed=11)
    ctx, t, T = ctx_t()
    with ctx:
        U = tl.from_numpy(u, domain=(t,))
        ahead = U[tl.min(t + 5, T - 1)]
        ahead_win = U[t : tl.min(t + 3, T)].sum(0)
    ga, gw = tl.evaluate([ahead, ahead_win], backend=backend)
    close(ga, np.array([u[min(k + 5, 10)] for k in range(11)]))
    close(gw, np.array([u[k : min(k + 3, 11)].sum() for k in range(11)]), rtol=1e-5, atol=1e-5)


def test_discounted_returns_via_suffix_slice(backend):
    """ret[t] = sum_{k >= t} g^(k-t) r[k], written as a suffix reduction."""
    r = _f32(10, seed=12)
    g = 0.9
    ctx, t, T = ctx_t()
    with ctx:
        R = tl.from_numpy(r, domain=(t,))
        gpow = tl.full((), g) ** tl.full((), t)  # g^t, a scalar over t
        z = R * gpow
        ret = z[t:T].sum(0) / gpow
    got = tl.evaluate(ret, backend=backend)
    want = np.zeros(10)
    acc = 0.0
    for k in reversed(range(10)):
        acc = r[k] + g * acc
        want[k] = acc
    close(got, want, rtol=1e-4, atol=1e-4)


def test_slice_of_a_recurrence_feeds_a_later_recurrence(backend):
    """A running maximum of a prefix, fed back into the state."""
    u = _f32(14, seed=13)
    ctx, t, T = ctx_t()
    with ctx:
        U = tl.from_numpy(u, domain=(t,))
        best = U[0 : t + 1].amax(0)
        s = tl.RecurrentTensor.placeholder((), domain=(t,))
        s[0] = 0.0
        s[t + 1] = s * 0.5 + best[t]
    got = tl.evaluate(s, backend=backend)
    want = [0.0]
    for k in range(13):
        want.append(want[-1] * 0.5 + u[: k + 1].max())
    close(got, np.array(want), rtol=1e-5, atol=1e-5)


# --- piecewise definitions ----------------------------------------------------------------------


def test_piecewise_by_condition_first_match_wins(backend):
    ctx, t, T = ctx_t()
    with ctx:
        y = tl.RecurrentTensor.placeholder((), domain=(t,))
        y[t < 3] = 1.0
        y[t < 6] = 2.0  # only applies to 3..5: the first branch already took 0..2
        y[(t % 2).eq(0)] = 3.0
        y[True] = 4.0
    got = tl.evaluate(y, bounds={T: 10}, backend=backend)
    want = []
    for k in range(10):
        want.append(1.0 if k < 3 else 2.0 if k < 6 else 3.0 if k % 2 == 0 else 4.0)
    close(got, np.array(want))


def test_piecewise_by_index_and_condition_with_recurrence(backend):
    u = _f32(12, seed=14)
    ctx, t, T = ctx_t()
    with ctx:
        U = tl.from_numpy(u, domain=(t,))
        x = tl.RecurrentTensor.placeholder((), domain=(t,))
        x[0] = 10.0
        x[t.eq(T - 1)] = -1.0  # the last point is fixed
        x[t + 1] = x[t] * 0.5 + U[t]
    got = tl.evaluate(x, backend=backend)
    want = [10.0]
    for k in range(10):
        want.append(want[-1] * 0.5 + u[k])
    want.append(-1.0)
    close(got, np.array(want), rtol=1e-5, atol=1e-5)


def test_conditions_with_and_or(backend):
    ctx, t, T = ctx_t()
    with ctx:
        y = tl.RecurrentTensor.placeholder((), dtype="int64", domain=(t,))
        y[(t >= 2) & (t <= 4)] = 1
        y[(t.eq(0)) | (t > T - 3)] = 2
        y[True] = 0
    got = tl.evaluate(y, bounds={T: 9}, backend=backend)
    want = [1 if 2 <= k <= 4 else 2 if (k == 0 or k > 6) else 0 for k in range(9)]
    np.testing.assert_array_equal(got, want)


# --- nested dims --------------------------------------------------------------------------------


def test_inner_recurrence_restarts_each_iteration(backend):
    c = _f32(4, seed=15)
    u = _f32(6, seed=16)
    ctx, i, t, I, T = ctx_it()
    with ctx:
        C = tl.from_numpy(c, domain=(i,))
        U = tl.from_numpy(u, domain=(t,))
        h = tl.RecurrentTensor.placeholder((), domain=(i, t))
        h[i, 0] = C[i]
        h[i, t + 1] = h[i, t] * 0.7 + U[t]
        final = h[i, T - 1]
        s = tl.RecurrentTensor.placeholder((), domain=(i,))
        s[0] = 0.0
        s[i + 1] = s[i] + final[i]
    gh, gf, gs = tl.evaluate([h, final, s], backend=backend)
    want = np.zeros((4, 6))
    for a in range(4):
        want[a, 0] = c[a]
        for k in range(5):
            want[a, k + 1] = want[a, k] * 0.7 + u[k]
    close(gh, want, rtol=1e-5, atol=1e-5)
    close(gf, want[:, -1], rtol=1e-5, atol=1e-5)
    close(gs, np.concatenate([[0.0], np.cumsum(want[:, -1])[:-1]]), rtol=1e-5, atol=1e-5)


def test_outer_state_drives_inner_recurrence(backend):
    """p[i] starts every inner rollout; the rollout's end updates p[i+1]."""
    ctx, i, t, I, T = ctx_it()
    with ctx:
        p = tl.RecurrentTensor.placeholder((), domain=(i,))
        h = tl.RecurrentTensor.placeholder((), domain=(i, t))
        p[0] = 1.0
        h[i, 0] = p[i]
        h[i, t + 1] = h[i, t] * 0.5 + p[i]
        p[i + 1] = p[i] - 0.1 * h[i, T - 1]
        ep_sum = h[i, 0:T].sum(0)
    gp, gh, ge = tl.evaluate([p, h, ep_sum], bounds={I: 5, T: 4}, backend=backend)
    wp = [1.0]
    wh = np.zeros((5, 4))
    for a in range(5):
        wh[a, 0] = wp[a]
        for k in range(3):
            wh[a, k + 1] = wh[a, k] * 0.5 + wp[a]
        wp.append(wp[a] - 0.1 * wh[a, -1])
    close(gp, np.array(wp[:5]), rtol=1e-5, atol=1e-6)
    close(gh, wh, rtol=1e-5, atol=1e-6)
    close(ge, wh.sum(1), rtol=1e-5, atol=1e-6)


def test_outer_accumulation_over_prefix_of_iterations(backend):
    ctx, i, t, I, T = ctx_it()
    with ctx:
        x = tl.RecurrentTensor.placeholder((), domain=(i, t))
        x[i, 0] = tl.full((), i) * 1.0  # a scalar whose value is the point's index
        x[i, t + 1] = x[i, t] + 1.0
        per_iter = x[i, 0:T].sum(0)
        running = per_iter[0 : i + 1].sum(0)
    gx, gr = tl.evaluate([x, running], bounds={I: 4, T: 3}, backend=backend)
    want = np.array([[a + k for k in range(3)] for a in range(4)], dtype=np.float64)
    close(gx, want)
    close(gr, np.cumsum(want.sum(1)))


# --- spatial ops inside recurrences ---------------------------------------------------------------


def test_softmax_policy_recurrence(backend):
    w = _f32(4, 4, seed=17)
    u = _f32(10, 4, seed=18)
    ctx, t, T = ctx_t()
    with ctx:
        W = tl.from_numpy(w)
        U = tl.from_numpy(u, domain=(t,))
        p = tl.RecurrentTensor.placeholder((4,), domain=(t,))
        p[0] = tl.full((4,), 0.25)
        p[t + 1] = (W @ p + U[t]).softmax(-1)
        lp = (W @ p).log_softmax(-1)
        best = p.argmax(-1)
    gp, gl, gb = tl.evaluate([p, lp, best], backend=backend)

    def softmax(v):
        e = np.exp(v - v.max())
        return e / e.sum()

    want = [np.full(4, 0.25)]
    for k in range(9):
        want.append(softmax(w @ want[-1] + u[k]))
    want = np.stack(want)
    close(gp, want, rtol=1e-5, atol=1e-6)
    z = want @ w.T
    close(gl, z - np.log(np.exp(z).sum(1, keepdims=True)), rtol=1e-4, atol=1e-5)
    np.testing.assert_array_equal(gb, want.argmax(-1))


def test_reshape_permute_transpose_in_recurrence(backend):
    c = _f32(2, 3, seed=19)
    ctx, t, T = ctx_t()
    with ctx:
        C = tl.from_numpy(c)
        m = tl.RecurrentTensor.placeholder((2, 3), domain=(t,))
        m[0] = C
        m[t + 1] = m.reshape(3, 2).transpose(0, 1) * 0.5 + C.permute(0, 1).tanh()
        flat = m.reshape(-1)
        col = m.unsqueeze(0).expand(4, 2, 3).sum(0)
    gm, gf, gc = tl.evaluate([m, flat, col], bounds={T: 6}, backend=backend)
    want = [c]
    for _ in range(5):
        want.append(want[-1].reshape(3, 2).T * 0.5 + np.tanh(c))
    want = np.stack(want)
    close(gm, want, rtol=1e-5, atol=1e-6)
    close(gf, want.reshape(6, 6), rtol=1e-5, atol=1e-6)
    close(gc, want * 4, rtol=1e-5, atol=1e-5)


def test_cat_stack_and_spatial_indexing_in_recurrence(backend):
    ctx, t, T = ctx_t()
    with ctx:
        x = tl.RecurrentTensor.placeholder((4,), domain=(t,))
        x[0] = tl.from_numpy(np.arange(4.0))
        x[t + 1] = tl.cat([x[t, 2:] * 0.5, x[t, :2] + 1.0], 0)
        pair = tl.stack([x[t, 0], x[t, 3]], 0)
    gx, gp = tl.evaluate([x, pair], bounds={T: 7}, backend=backend)
    want = [np.arange(4.0)]
    for _ in range(6):
        v = want[-1]
        want.append(np.concatenate([v[2:] * 0.5, v[:2] + 1.0]))
    want = np.stack(want)
    close(gx, want)
    close(gp, want[:, [0, 3]])


def test_gather_and_comparisons_in_recurrence(backend):
    table = _f32(5, seed=20)
    ctx, t, T = ctx_t()
    with ctx:
        tab = tl.from_numpy(table)
        k = tl.RecurrentTensor.placeholder((1,), dtype="int64", domain=(t,))
        k[0] = tl.from_numpy(np.array([0]))
        k[t + 1] = tl.where(k >= 4, k - 4, k + 1)
        picked = tab.gather(0, k)
        pos = (picked > 0.0).sum()
    gk, gpk, gpos = tl.evaluate([k, picked, pos], bounds={T: 9}, backend=backend)
    want_k = np.array([[j % 5] for j in range(9)])
    np.testing.assert_array_equal(gk, want_k)
    close(gpk, table[want_k])
    np.testing.assert_array_equal(gpos, (table[want_k] > 0).sum(1))


# --- optimisers over the iteration dim -----------------------------------------------------------


def test_sgd_linear_regression_whole_trajectory(backend):
    xs = _f32(16, 3, seed=21)
    ys = (xs @ np.array([1.0, -2.0, 0.5], np.float32) + 0.3).astype(np.float32)
    lr, steps = 0.1, 25
    ctx = tl.Context(dims=("i",))
    (i,), (I,) = ctx.dims, ctx.bounds
    with ctx:
        X, Y = tl.from_numpy(xs), tl.from_numpy(ys)
        w = tl.RecurrentTensor.placeholder((3,), domain=(i,), requires_grad=True)
        b = tl.RecurrentTensor.placeholder((), domain=(i,), requires_grad=True)
        w[0] = tl.zeros((3,))
        b[0] = 0.0
        loss = ((X @ w + b - Y) ** 2).mean()
        loss.backward()
        tl.optim.SGD([w, b], lr=lr).step()
    gw, gb, gl = tl.evaluate([w, b, loss], bounds={I: steps}, backend=backend)
    ww, wb, wl = [np.zeros(3)], [0.0], []
    for _ in range(steps):
        err = xs @ ww[-1] + wb[-1] - ys
        wl.append((err**2).mean())
        ww.append(ww[-1] - lr * 2 * xs.T @ err / len(ys))
        wb.append(wb[-1] - lr * 2 * err.mean())
    close(gw, np.stack(ww[:steps]), rtol=1e-4, atol=1e-5)
    close(gb, np.array(wb[:steps]), rtol=1e-4, atol=1e-5)
    close(gl, np.array(wl), rtol=1e-4, atol=1e-5)
    assert wl[-1] < wl[0] * 0.2


def test_adam_trajectory(backend):
    target = np.array([1.0, -1.0], np.float32)
    lr, b1, b2, eps, steps = 0.05, 0.9, 0.999, 1e-8, 12
    ctx = tl.Context(dims=("i",))
    (i,), (I,) = ctx.dims, ctx.bounds
    with ctx:
        tgt = tl.from_numpy(target)
        w = tl.RecurrentTensor.placeholder((2,), domain=(i,), requires_grad=True)
        w[0] = tl.zeros((2,))
        loss = ((w - tgt) ** 2).sum()
        loss.backward()
        tl.optim.Adam([w], lr=lr, betas=(b1, b2), eps=eps).step()
    got = tl.evaluate(w, bounds={I: steps}, backend=backend)
    ws, m, v = [np.zeros(2)], np.zeros(2), np.zeros(2)
    for k in range(steps - 1):
        g = 2 * (ws[-1] - target)
        m = b1 * m + (1 - b1) * g
        v = b2 * v + (1 - b2) * g * g
        mh, vh = m / (1 - b1 ** (k + 1)), v / (1 - b2 ** (k + 1))
        ws.append(ws[-1] - lr * mh / (np.sqrt(vh) + eps))
    close(got, np.stack(ws), rtol=1e-4, atol=1e-5)


# --- sinks, compile/run/value -------------------------------------------------------------------


def test_sink_receives_values_in_order(backend):
    ctx, t, T = ctx_t()
    seen = []
    with ctx:
        x = tl.RecurrentTensor.placeholder((2,), domain=(t,))
        x[0] = tl.ones((2,))
        x[t + 1] = x * 2.0
        tl.sink(x, lambda value, point: seen.append((point["t"], np.array(value))))
    prog = ctx.compile(bounds={T: 6}, backend=backend, outputs=[x])
    prog.run()
    assert [p for p, _ in seen] == list(range(6))
    close(np.stack([v for _, v in seen]), np.stack([np.ones(2) * 2**k for k in range(6)]))
    close(prog.value(x), np.stack([v for _, v in seen]))
    assert prog.stats()["peak_bytes"] > 0


@pytest.mark.parametrize("optimize", [True, False])
def test_evaluate_runs_an_effect_at_every_point_with_what_it_reads(backend, optimize):
    # obs[t + 1] = step(action[t]): the step runs at t = T - 1 too (an effect runs at every
    # point) though no value asked for reads its result there; what it reads at that point
    # must be computed, not handed over missing (it was None in generated code)
    ctx, t, T = ctx_t()
    calls = []

    def step(a):
        calls.append(np.array(a))
        return np.full((2, 3), np.sum(a), np.float32)

    with ctx:
        obs = tl.RecurrentTensor.placeholder((2, 3), "float32", (t,))
        obs[0] = tl.ones((2, 3))
        action = obs @ tl.ones((3, 2))
        nxt = tl.api.functional.apply(
            "udf", action.view, fn=step, shape=(2, 3), dtype=np.dtype("float32"), effect=True
        )
        ctx.add_root(nxt.op)
        obs[t + 1] = tl.RecurrentTensor(nxt, ctx)
    got = tl.evaluate(obs, bounds={T: 3}, backend=backend, optimize=optimize)
    close(got[:, 0, 0], [1.0, 12.0, 144.0])
    assert [c.shape for c in calls] == [(2, 2)] * 3
    close(calls[-1], np.full((2, 2), 432.0))


def test_nested_sink_order_is_lexicographic(backend):
    ctx, i, t, I, T = ctx_it()
    seen = []
    with ctx:
        h = tl.RecurrentTensor.placeholder((), domain=(i, t))
        h[i, 0] = tl.full((), i) * 10.0
        h[i, t + 1] = h[i, t] + 1.0
        tl.sink(h, lambda value, point: seen.append((point["i"], point["t"], float(value))))
    ctx.compile(bounds={I: 3, T: 4}, backend=backend).run()
    assert [(a, b) for a, b, _ in seen] == [(a, b) for a in range(3) for b in range(4)]
    assert [v for _, _, v in seen] == [10.0 * a + b for a in range(3) for b in range(4)]


def test_sink_of_a_reduction_fires_once_with_the_total(backend):
    ctx, t, T = ctx_t()
    seen = []
    with ctx:
        u = tl.from_numpy(np.arange(8.0), domain=(t,))
        tl.sink(u[0:T].sum(0), lambda value, point: seen.append((point, float(value))))
    ctx.compile(backend=backend).run()
    assert seen == [({}, 28.0)]


def test_program_runs_twice_with_same_results(backend):
    ctx, t, T = ctx_t()
    with ctx:
        x = tl.RecurrentTensor.placeholder((), domain=(t,))
        x[0] = 2.0
        x[t + 1] = x.sqrt() + 1.0
    prog = ctx.compile(bounds={T: 10}, backend=backend, outputs=[x])
    first = prog.run().value(x).copy()
    second = prog.run().value(x)
    close(first, second)
    close(first, tl.evaluate(x, bounds={T: 10}, backend="numpy"))
    assert "schedule" in prog.explain()


# --- randomness ---------------------------------------------------------------------------------


def _noise_program():
    ctx, t, T = ctx_t()
    with ctx:
        x = tl.RecurrentTensor.placeholder((), domain=(t,))
        x[0] = 0.0
        x[t + 1] = x + tl.randn((), like=x)[t]
        n = tl.rand((3,), like=x)
    return ctx, T, x, n


def test_random_is_reproducible_by_seed_and_same_across_backends():
    ctx, T, x, n = _noise_program()
    a = tl.evaluate([x, n], bounds={T: 20}, backend="numpy", seed=7)
    b = tl.evaluate([x, n], bounds={T: 20}, backend="numpy", seed=7)
    c = tl.evaluate([x, n], bounds={T: 20}, backend="torch", seed=7)
    d = tl.evaluate([x, n], bounds={T: 20}, backend="numpy", seed=8)
    for u, v in zip(a, b, strict=True):
        np.testing.assert_array_equal(u, v)
    for u, v in zip(a, c, strict=True):
        close(u, v, rtol=1e-6, atol=1e-6)
    assert not np.allclose(a[1], d[1])
    # uniform noise is in [0, 1) and differs from point to point
    assert (a[1] >= 0).all() and (a[1] < 1).all()
    assert len(np.unique(a[1])) == a[1].size


def test_random_walk_is_cumulative_sum_of_its_noise(backend):
    ctx, t, T = ctx_t()
    with ctx:
        x = tl.RecurrentTensor.placeholder((), domain=(t,))
        eps = tl.randn((), like=x)
        x[0] = 0.0
        x[t + 1] = x + eps
    gx, ge = tl.evaluate([x, eps], bounds={T: 30}, backend=backend, seed=3)
    close(gx, np.concatenate([[0.0], np.cumsum(ge)[:-1]]), rtol=1e-5, atol=1e-5)
    assert 0.3 < np.std(ge) < 3.0


# --- memory -------------------------------------------------------------------------------------


def _sink_only_peak(steps: int, backend: str, keep_all: bool) -> int:
    ctx, t, T = ctx_t()
    seen = []
    with ctx:
        x = tl.RecurrentTensor.placeholder((256,), domain=(t,))
        x[0] = tl.zeros((256,))
        x[t + 1] = x[t] * 0.5 + 1.0
        tl.sink(x.sum(), lambda value, point: seen.append(float(value)))
        if keep_all:
            tl.sink(x[0:T].sum(), lambda value, point: seen.append(float(value)))
    prog = ctx.compile(bounds={T: steps}, backend=backend)
    prog.run()
    assert len(seen) == steps + (1 if keep_all else 0)
    peak = prog.stats()["peak_bytes"]
    assert peak > 0
    return peak


def test_forward_recurrence_memory_does_not_grow_with_length(backend):
    short = _sink_only_peak(50, backend, keep_all=False)
    long = _sink_only_peak(500, backend, keep_all=False)
    assert long <= short * 1.1 + 1024, (short, long)
    assert long < 10 * 256 * 4  # a handful of rows, not 500


def test_full_slice_reader_keeps_every_point(backend):
    short = _sink_only_peak(50, backend, keep_all=True)
    long = _sink_only_peak(500, backend, keep_all=True)
    assert long >= 500 * 256 * 4
    assert long > 5 * short


@pytest.mark.parametrize("steps", [1, 2])
def test_tiny_bounds(backend, steps):
    ctx, t, T = ctx_t()
    with ctx:
        x = tl.RecurrentTensor.placeholder((), domain=(t,))
        x[0] = 5.0
        x[t + 1] = x - 1.0
        s = x[0 : t + 1].sum(0)
    gx, gs = tl.evaluate([x, s], bounds={T: steps}, backend=backend)
    want = np.array([5.0 - k for k in range(steps)])
    close(gx, want)
    close(gs, np.cumsum(want))


# --- backward recurrences, multi-step reads, dynamic episode lengths ---------------------------


def _discounted(r, g):
    out = np.zeros(len(r))
    acc = 0.0
    for k in reversed(range(len(r))):
        acc = r[k] + g * acc
        out[k] = acc
    return out


def test_contract_backward_recurrence_by_condition(backend):
    ctx, t, T = ctx_t()
    with ctx:
        y = tl.RecurrentTensor.placeholder((), domain=(t,))
        y[t.eq(T - 1)] = 1.0
        y[True] = y[t + 1] * 0.9
    got = tl.evaluate(y, bounds={T: 10}, backend=backend)
    close(got, np.array([0.9 ** (9 - k) for k in range(10)]), rtol=1e-5)


def test_discounted_returns_backward_recurrence(backend):
    r = np.random.RandomState(0).randn(12).astype(np.float32)
    ctx, t, T = ctx_t()
    with ctx:
        R = tl.from_numpy(r, domain=(t,))
        ret = tl.RecurrentTensor.placeholder((), domain=(t,))
        ret[T - 1] = R[T - 1]
        ret[True] = R[t] + 0.95 * ret[t + 1]
    close(tl.evaluate(ret, backend=backend), _discounted(r, 0.95), rtol=1e-4, atol=1e-4)


def test_backward_recurrence_with_shifted_left_index(backend):
    r = np.random.RandomState(1).randn(8).astype(np.float32)
    ctx, t, T = ctx_t()
    with ctx:
        R = tl.from_numpy(r, domain=(t,))
        ret = tl.RecurrentTensor.placeholder((), domain=(t,))
        ret[T - 1] = R[T - 1]
        ret[t - 1] = R[t - 1] + 0.5 * ret[t]
    close(tl.evaluate(ret, backend=backend), _discounted(r, 0.5), rtol=1e-4, atol=1e-4)


def test_recurrence_reading_two_steps_back(backend):
    ctx, t, T = ctx_t()
    with ctx:
        x = tl.RecurrentTensor.placeholder((), domain=(t,))
        x[0] = 1.0
        x[1] = 2.0
        x[t + 1] = 0.5 * x[t] + 0.25 * x[t - 1]
    got = tl.evaluate(x, bounds={T: 10}, backend=backend)
    want = [1.0, 2.0]
    for _ in range(8):
        want.append(0.5 * want[-1] + 0.25 * want[-2])
    close(got, np.array(want))


def test_outer_accumulation_reading_next_iteration(backend):
    ctx, i, t, I, T = ctx_it()
    with ctx:
        h = tl.RecurrentTensor.placeholder((), domain=(i, t))
        h[i, 0] = tl.full((), i) * 1.0
        h[i, t + 1] = h[i, t] * 0.5 + 1.0
        acc = tl.RecurrentTensor.placeholder((), domain=(i,))
        acc[0] = h[0, T - 1]
        acc[i + 1] = acc[i] + h[i + 1, T - 1]
    got = tl.evaluate(acc, bounds={I: 3, T: 4}, backend=backend)
    h_np = np.zeros((3, 4))
    for a in range(3):
        h_np[a, 0] = a
        for k in range(3):
            h_np[a, k + 1] = h_np[a, k] * 0.5 + 1.0
    close(got, np.cumsum(h_np[:, -1]))


def test_until_data_dependent_stop(backend):
    ctx, t, T = ctx_t()
    with ctx:
        x = tl.RecurrentTensor.placeholder((), domain=(t,))
        x[0] = 1.0
        x[t + 1] = x * 1.5
        ctx.until(t, x > 10.0)
    got = tl.evaluate(x, bounds={T: 100}, backend=backend)
    want = [1.0]
    while want[-1] <= 10.0:
        want.append(want[-1] * 1.5)
    close(got, np.array(want), rtol=1e-5)


def test_until_stops_at_cap_when_never_done(backend):
    ctx, t, T = ctx_t()
    with ctx:
        x = tl.RecurrentTensor.placeholder((), domain=(t,))
        x[0] = 0.0
        x[t + 1] = x + 1.0
        ctx.until(t, x < -1.0)
        total = x[0:T].sum(0)
    gx, gt = tl.evaluate([x, total], bounds={T: 7}, backend=backend)
    close(gx, np.arange(7.0))
    close(gt, 21.0)


def test_until_per_outer_iteration_lengths(backend):
    ctx, i, t, I, T = ctx_it()
    with ctx:
        x = tl.RecurrentTensor.placeholder((), domain=(i, t))
        x[i, 0] = tl.full((), i) * 1.0
        x[i, t + 1] = x[i, t] + 1.0
        ctx.until(t, x >= 4.0)
        length = x[i, 0:T].sum(0)
    got = tl.evaluate(length, bounds={I: 3, T: 50}, backend=backend)
    want = [sum(range(a, 5)) for a in range(3)]
    close(got, np.array(want, dtype=np.float64))


def _until_three(backend, define):
    """What ``define(U, t, T)`` returns, ``t`` ended where ``U = arange(10)`` reaches 3 (so
    ``T`` is 4), evaluated with and without the optimising passes."""
    ctx, t, T = ctx_t()
    with ctx:
        U = tl.from_numpy(np.arange(10.0), domain=(t,), dtype="float64")
        out = define(U, t, T)
        ctx.until(t, U >= 3.0)  # defined last: what reads U's points comes first
    return [tl.evaluate(out, bounds={T: 10}, backend=backend, optimize=o) for o in (True, False)]


def test_until_the_length_is_read_only_once_the_dim_has_ended(backend):
    # a mean over the whole dim divides by its length, a value with no edge from the loop
    # that ends it: it must still run after that loop (it ran first, reading no length)
    def define(U, t, T):
        mean = tl.RecurrentTensor.placeholder((), dtype="float64", domain=(t,))
        mean[True] = U[0:T].mean(0)
        return mean

    for got in _until_three(backend, define):
        close(got, np.full(4, 1.5))


def test_until_reads_ahead_that_the_stop_does_not_need_run_after_it(backend):
    # the stopping loop runs first and forward; what reads ahead of it (the next point, a
    # backward recurrence) runs in loops after it, over the length it found (a read ahead was
    # fused in front, making the stopping loop run backward, and the program was rejected)
    def define(U, t, T):
        r = tl.RecurrentTensor.placeholder((), dtype="float64", domain=(t,))
        r[t.eq(T - 1)] = U
        r[True] = U + 0.5 * r[t + 1]
        return [U[tl.min(t + 1, T - 1)] * 1.0, r]

    want = [3.0]
    for k in (2, 1, 0):
        want.insert(0, k + 0.5 * want[0])
    for got_ahead, got_r in _until_three(backend, define):
        close(got_ahead, [1.0, 2.0, 3.0, 3.0])
        close(got_r, np.array(want))


def test_until_a_branch_at_the_last_point_runs_once_the_length_is_known(backend):
    # x[t.eq(T - 1)] is guarded by the length the stopping loop finds: computed inside that
    # loop, its guard saw the cap and it ran at no point the loop reached
    def define(U, t, T):
        x = tl.RecurrentTensor.placeholder((), dtype="float64", domain=(t,))
        x[t.eq(T - 1)] = U[0 : t + 1].mean(0) * 10.0
        x[True] = U
        return x

    for got in _until_three(backend, define):
        close(got, [0.0, 1.0, 2.0, 15.0])


def test_until_a_dim_whose_stop_is_one_for_all_moves_outside_the_others(backend):
    # x[i, t + 1] reads every i at t, so the loop over t must enclose the one over i; t ends
    # by a stop that does not vary over i, so it may (it stayed inside, and was refused)
    ctx, i, t, I, T = ctx_it()
    with ctx:
        u = tl.from_numpy(np.arange(5.0), domain=(t,), dtype="float64")
        x = tl.RecurrentTensor.placeholder((), dtype="float64", domain=(i, t))
        x[i, 0] = tl.full((), i) * 1.0
        x[i, t + 1] = x[0:I, t].sum(0) + u[t]
        ctx.until(t, u >= 2.0)
    for optimize in (True, False):
        got = tl.evaluate(x, bounds={I: 2, T: 5}, backend=backend, optimize=optimize)
        close(got, [[0.0, 1.0, 3.0], [1.0, 1.0, 3.0]])


def test_until_with_recurrences_that_need_different_loop_orders(backend):
    # h carries across i (i outer), y reads every i at t (t outer): the two run one after the
    # other, after the loop that finds where t ends
    ctx, i, t, I, T = ctx_it()
    with ctx:
        u = tl.from_numpy(np.arange(5.0), domain=(t,), dtype="float64")
        h = tl.RecurrentTensor.placeholder((), dtype="float64", domain=(i, t))
        h[0, 0] = 0.0
        h[i + 1, 0] = h[i, T - 1]
        h[i, t + 1] = h[i, t] + 1.0
        y = tl.RecurrentTensor.placeholder((), dtype="float64", domain=(i, t))
        y[i, 0] = h[0:I, 0].sum(0)
        y[i, t + 1] = y[I - 1, t] + y[tl.max(i - 1, 0), t]
        ctx.until(t, u >= 2.0)
    for optimize in (True, False):
        gh, gy = tl.evaluate([h, y], bounds={I: 2, T: 5}, backend=backend, optimize=optimize)
        close(gh, [[0.0, 1.0, 2.0], [2.0, 3.0, 4.0]])
        close(gy, [[2.0, 4.0, 8.0], [2.0, 4.0, 8.0]])


def test_attention_over_the_prefix(backend):
    """Dynamic shapes: scores over x[0:t+1], a softmax over that dynamic axis, a weighted sum."""
    u = np.random.RandomState(30).randn(7, 3).astype(np.float32)
    ctx, t, T = ctx_t()
    with ctx:
        U = tl.from_numpy(u, domain=(t,))
        hist = U[0 : t + 1]
        scores = (hist @ U[t]).softmax(-1)
        out = (scores.unsqueeze(-1) * hist).sum(0)
        out2 = scores @ hist
    got, got2 = tl.evaluate([out, out2], backend=backend)
    want = []
    for k in range(7):
        s = u[: k + 1] @ u[k]
        e = np.exp(s - s.max())
        want.append((e / e.sum()) @ u[: k + 1])
    close(got, np.stack(want), rtol=1e-5, atol=1e-5)
    close(got2, np.stack(want), rtol=1e-5, atol=1e-5)


def test_dynamic_cat_and_reshape(backend):
    u = np.arange(6.0, dtype=np.float32) * 1.5
    ctx, t, T = ctx_t()
    with ctx:
        U = tl.from_numpy(u, domain=(t,))
        both = tl.cat([U[0 : t + 1], U[t:T]], 0)
        col = U[0 : t + 1].reshape(-1, 1).sum(0)
    gb, gc = tl.evaluate([both, col], backend=backend)
    close(gb, [np.concatenate([u[: k + 1], u[k:]]) for k in range(6)])
    close(gc, np.cumsum(u)[:, None])


def test_spatial_index_after_point_index(backend):
    u = np.arange(12.0, dtype=np.float32).reshape(4, 3)
    ctx, t, T = ctx_t()
    with ctx:
        U = tl.from_numpy(u, domain=(t,))
        tail = U[t, 1:]
        prev_first = U[tl.max(t - 1, 0), 0]
    ga, gb = tl.evaluate([tail, prev_first], backend=backend)
    close(ga, u[:, 1:])
    close(gb, np.array([u[max(k - 1, 0), 0] for k in range(4)]))


def test_until_per_iteration_with_suffix_returns(backend):
    ctx, i, t, I, T = ctx_it()
    with ctx:
        x = tl.RecurrentTensor.placeholder((), domain=(i, t))
        x[i, 0] = tl.full((), i) * 1.0
        x[i, t + 1] = x[i, t] + 1.0
        ctx.until(t, x >= 4.0)
        ret = x[i, t:T].sum(0)
    gx, gr = tl.evaluate([x, ret], bounds={I: 3, T: 50}, backend=backend)
    want_x = [np.arange(a, 5.0) for a in range(3)]
    close(gx, want_x)
    close(gr, [np.cumsum(w[::-1])[::-1] for w in want_x])


@pytest.mark.parametrize("optimize", [True, False])
def test_until_a_base_case_that_reads_an_input_at_the_first_point(backend, optimize):
    # ``r[0] * 0.5`` has no dim t but reads r over t, and the stop needs it: it runs inside
    # the stopping loop, at t = 0, rather than after a loop over r of its own (and once more
    # after it, where it is asked for too)
    r_np = np.random.default_rng(0).uniform(-1.0, 1.0, 12)
    ctx, t, T = ctx_t()
    with ctx:
        r = tl.from_numpy(r_np, domain=(t,), dtype="float64")
        start = r[0] * 0.5
        x = tl.RecurrentTensor.placeholder((), domain=(t,), dtype="float64")
        x[0] = start
        x[t + 1] = x + r.abs()
        ctx.until(t, x >= 2.0)
        total = x[0:T].sum(0)
    for outputs in ([x, total], [x, total, start]):
        got = tl.evaluate(outputs, backend=backend, optimize=optimize)
        want = [r_np[0] * 0.5]
        while want[-1] < 2.0:
            want.append(want[-1] + abs(r_np[len(want) - 1]))
        close(got[0], np.array(want))
        close(got[1], sum(want))
        if len(outputs) == 3:
            close(got[2], r_np[0] * 0.5)


def _ragged(define, backend="numpy", optimize=True):
    """``define(i, t, T, r)``'s values, ``t`` ended per ``i`` after 3, 7 and 5 points of
    ``r`` (uniform in (-1, 1)); also returns ``r`` and the lengths."""
    r_np = np.random.default_rng(1).uniform(-1.0, 1.0, (3, 12))
    lengths = [3, 7, 5]
    stop_np = np.zeros((3, 12))
    stop_np[range(3), np.array(lengths) - 1] = 1.0
    ctx, i, t, I, T = ctx_it()
    with ctx:
        r = tl.from_numpy(r_np, domain=(i, t), dtype="float64")
        ctx.until(t, tl.from_numpy(stop_np, domain=(i, t)) > 0.5)
        out = define(i, t, T, r)
    return tl.evaluate(out, backend=backend, optimize=optimize), r_np, lengths


@pytest.mark.parametrize("optimize", [True, False])
def test_until_per_outer_iteration_mean_and_last_point(backend, optimize):
    # the mean's count (a full of T, written without i) is each i's own length; every
    # episode has a point 0, so the previous one's may be read
    (mean, last, first), r_np, lengths = _ragged(
        lambda i, t, T, r: [r[i, 0:T].mean(0), r[i, T - 1], r[tl.max(i - 1, 0), 0]],
        backend,
        optimize,
    )
    close(mean, np.array([r_np[k, :n].mean() for k, n in enumerate(lengths)]))
    close(last, np.array([r_np[k, n - 1] for k, n in enumerate(lengths)]))
    close(first, r_np[[0, 0, 1], 0])


def test_until_per_outer_iteration_gradient_of_each_episodes_mean(backend):
    torch = pytest.importorskip("torch")
    ctx, i, t, I, T = ctx_it()
    r_np = np.random.default_rng(2).uniform(-1.0, 1.0, (3, 12))
    lengths = [3, 7, 5]
    stop_np = np.zeros((3, 12))
    stop_np[range(3), np.array(lengths) - 1] = 1.0
    with ctx:
        r = tl.from_numpy(r_np, domain=(i, t), dtype="float64", requires_grad=True)
        ctx.until(t, tl.from_numpy(stop_np, domain=(i, t)) > 0.5)
        y = (r * 2.0).tanh()
        loss = (y * y)[i, 0:T].mean(0)[0:I].sum(0)
        loss.backward()
    got_loss, got_grad = tl.evaluate([loss, r.grad], backend=backend)
    ref = torch.tensor(r_np, requires_grad=True)
    want = sum(((ref[k, :n] * 2.0).tanh() ** 2).mean() for k, n in enumerate(lengths))
    want.backward()
    close(got_loss, want.item())
    for k, n in enumerate(lengths):
        close(got_grad[k], ref.grad.numpy()[k, :n])


@pytest.mark.parametrize("optimize", [True, False])
def test_until_per_outer_iteration_with_a_schedule_over_t_alone(backend, optimize):
    # c and its running sum are over t without i: their points run to each i's own length
    c_np = np.linspace(0.0, 1.0, 12)

    def define(i, t, T, r):
        c = tl.from_numpy(c_np, domain=(t,), dtype="float64")
        s = tl.RecurrentTensor.placeholder((), domain=(t,), dtype="float64")
        s[0] = 0.0
        s[t + 1] = s[t] + c[t]
        return r * c + s

    got, r_np, lengths = _ragged(define, backend, optimize)
    for k, n in enumerate(lengths):
        close(got[k], r_np[k, :n] * c_np[:n] + np.concatenate([[0.0], np.cumsum(c_np[: n - 1])]))


@pytest.mark.parametrize("optimize", [True, False])
def test_until_per_outer_iteration_lengths_read_again_by_a_later_loop(backend, optimize):
    # reading u ahead over i (u[i:I]) runs the stop in a backward loop over i, and x in a
    # second, forward one: each of its loops over t runs to its own i's length
    u_np = np.arange(1.0, 4.0)

    def define(i, t, T, r):
        u = tl.from_numpy(u_np, domain=(i,), dtype="float64")
        x = tl.RecurrentTensor.placeholder((), domain=(i, t), dtype="float64")
        x[t.eq(0)] = u[i : tl.min(i + 2, 3)].sum(0) + u[0 : i + 1].sum(0)
        x[True] = x[i, t - 1] + r[i, t]
        return x

    got, r_np, lengths = _ragged(define, backend, optimize)
    for k, n in enumerate(lengths):
        first = u_np[k : k + 2].sum() + u_np[: k + 1].sum()
        close(got[k], first + np.concatenate([[0.0], np.cumsum(r_np[k, 1:n])]))


@pytest.mark.parametrize("optimize", [True, False])
def test_until_per_outer_iteration_noise_over_t_alone_is_the_same_in_every_episode(
    backend, optimize
):
    def define(i, t, T, r):
        c = tl.from_numpy(np.zeros(12), domain=(t,), dtype="float64")
        return r * 0.0 + tl.randn((), like=c)

    got, _r, lengths = _ragged(define, backend, optimize)
    longest = got[int(np.argmax(lengths))]
    for k, n in enumerate(lengths):
        close(got[k], longest[:n])
    assert np.std(longest) > 0.1  # noise, not a constant


@pytest.mark.parametrize("optimize", [True, False])
def test_until_per_outer_iteration_carry_through_a_tensor_over_the_outer_dim(backend, optimize):
    def define(i, t, T, r):
        h = tl.RecurrentTensor.placeholder((), domain=(i, t), dtype="float64")
        last = h[i, T - 1] * 1.0  # an op over i: each i's own last point
        h[0, 0] = 0.0
        h[i + 1, 0] = last[i]
        h[i, t + 1] = h[i, t] + r[i, t]
        return h

    h, r_np, lengths = _ragged(define, backend, optimize)
    carry = 0.0
    for k, n in enumerate(lengths):
        want = carry + np.concatenate([[0.0], np.cumsum(r_np[k, : n - 1])])
        close(h[k], want)
        carry = want[-1]


def test_sink_under_until_sees_only_the_episode(backend):
    ctx, t, T = ctx_t()
    seen = []
    with ctx:
        x = tl.RecurrentTensor.placeholder((), domain=(t,))
        x[0] = 1.0
        x[t + 1] = x * 2.0
        ctx.until(t, x >= 16.0)
        tl.sink(x, lambda value, point: seen.append((point["t"], float(value))))
    ctx.compile(bounds={T: 100}, backend=backend).run()
    assert seen == [(k, 2.0**k) for k in range(5)]


def test_random_is_a_pure_function_of_seed_op_and_point():
    ctx, t, T = ctx_t()
    with ctx:
        x = tl.RecurrentTensor.placeholder((), domain=(t,))
        x[True] = 0.0
        n = tl.randn((2,), like=x)
        m = tl.randn((2,), like=x)
        y = n * 2.0
    alone = tl.evaluate(n, bounds={T: 5})
    with_other = tl.evaluate([y, n], bounds={T: 5})
    np.testing.assert_array_equal(alone, with_other[1])  # same op, same points: same values
    close(with_other[0], alone * 2.0)
    assert not np.allclose(alone, tl.evaluate(m, bounds={T: 5}))  # another op: other noise


def test_random_over_two_dims_differs_at_every_point(backend):
    ctx, i, t, I, T = ctx_it()
    with ctx:
        x = tl.RecurrentTensor.placeholder((), domain=(i, t))
        x[True] = 0.0
        n = tl.rand((), like=x)
    v = tl.evaluate(n, bounds={I: 3, T: 4}, backend=backend)
    assert v.shape == (3, 4)
    assert len(np.unique(v)) == 12


def test_var_std_min_over_spatial_dims(backend):
    u = np.random.RandomState(31).randn(5, 4).astype(np.float32)
    ctx, t, T = ctx_t()
    with ctx:
        U = tl.from_numpy(u, domain=(t,))
        v, s, m = U.var(), U.std(-1), U.min()
    gv, gs, gm = tl.evaluate([v, s, m], backend=backend)
    close(gv, u.var(1, ddof=1), rtol=1e-5)
    close(gs, u.std(1, ddof=1), rtol=1e-5)
    close(gm, u.min(1))


def test_bool_recurrence_and_where(backend):
    ctx, t, T = ctx_t()
    with ctx:
        b = tl.RecurrentTensor.placeholder((), dtype="bool", domain=(t,))
        b[0] = True
        b[t + 1] = ~b
        c = tl.where(b, 1.0, -1.0)
        e = c == 1.0
    gb, gc, ge = tl.evaluate([b, c, e], bounds={T: 6}, backend=backend)
    want = np.array([k % 2 == 0 for k in range(6)])
    np.testing.assert_array_equal(gb, want)
    close(gc, np.where(want, 1.0, -1.0))
    np.testing.assert_array_equal(ge, want)


def test_integer_prefix_sum_and_mean(backend):
    ctx, t, T = ctx_t()
    with ctx:
        u = tl.from_numpy(np.arange(6), domain=(t,))
        s = u[0 : t + 1].sum(0)
        m = u[0 : t + 1].mean(0)
    gs, gm = tl.evaluate([s, m], backend=backend)
    np.testing.assert_array_equal(gs, np.cumsum(np.arange(6)))
    close(gm, np.array([np.arange(k + 1).mean() for k in range(6)]))


def test_empty_slices_sum_to_zero(backend):
    u = np.arange(5.0, dtype=np.float32) + 1
    ctx, t, T = ctx_t()
    with ctx:
        U = tl.from_numpy(u, domain=(t,))
        before = U[0:t].sum(0)  # empty at t = 0
        after = U[t + 1 : T].sum(0)  # empty at t = T - 1
    gb, ga = tl.evaluate([before, after], backend=backend)
    close(gb, np.array([u[:k].sum() for k in range(5)]))
    close(ga, np.array([u[k + 1 :].sum() for k in range(5)]))


def test_until_without_cap(backend):
    ctx, t, T = ctx_t()
    with ctx:
        x = tl.RecurrentTensor.placeholder((), domain=(t,))
        x[0] = 1.0
        x[t + 1] = x * 2.0
        ctx.until(t, x >= 8.0)
        total = x[0:T].sum(0)
    prog = ctx.compile(backend=backend, outputs=[total, x])
    prog.run()
    close(prog.value(x), np.array([1.0, 2.0, 4.0, 8.0]))
    close(prog.value(total), 15.0)


def test_sink_on_backward_recurrence_sees_every_point_once(backend):
    ctx, t, T = ctx_t()
    seen = {}
    with ctx:
        y = tl.RecurrentTensor.placeholder((), domain=(t,))
        y[t.eq(T - 1)] = 1.0
        y[True] = y[t + 1] * 0.5
        tl.sink(y, lambda value, point: seen.setdefault(point["t"], []).append(float(value)))
    ctx.compile(bounds={T: 5}, backend=backend).run()
    assert seen == {k: [0.5 ** (4 - k)] for k in range(5)}


def test_small_program_compiles_fast():
    ctx, t, T = ctx_t()
    with ctx:
        x = tl.RecurrentTensor.placeholder((4,), domain=(t,))
        x[0] = tl.zeros((4,))
        x[t + 1] = (x * 0.5 + 1.0).tanh().exp() - 1.0
        y = x[0 : t + 1].sum(0).sigmoid()
    prog = ctx.compile(bounds={T: 100}, outputs=[y])
    assert prog.stats()["compile_seconds"] < 1.0
    assert prog.stats()["ops"] >= 5


# --- random recurrence programs -----------------------------------------------------------------

READS = ["now", "next", "ahead", "lag", "prefix", "suffix", "window"]


def _tl_read(U, kind, k, t, T):
    if kind == "now":
        return U[t]
    if kind == "next":
        return U[t + 1]
    if kind == "ahead":
        return U[tl.min(t + k, T - 1)]
    if kind == "lag":
        return U[tl.max(t - k, 0)]
    if kind == "prefix":
        return U[0 : t + 1].sum(0)
    if kind == "suffix":
        return U[t:T].sum(0)
    return U[tl.max(t - k, 0) : t + 1].mean(0)


def _np_read(u, kind, k, p):
    n = len(u)
    if kind == "now":
        return u[p]
    if kind == "next":
        return u[p + 1]
    if kind == "ahead":
        return u[min(p + k, n - 1)]
    if kind == "lag":
        return u[max(p - k, 0)]
    if kind == "prefix":
        return u[: p + 1].sum()
    if kind == "suffix":
        return u[p:].sum()
    return u[max(p - k, 0) : p + 1].mean()


@settings(max_examples=25, deadline=None)
@given(
    n=st.integers(2, 10),
    a=st.floats(-0.9, 0.9),
    b=st.floats(-2, 2),
    c0=st.floats(-2, 2),
    kind=st.sampled_from(READS),
    out_kind=st.sampled_from(READS),
    k=st.integers(1, 4),
    nonlinear=st.booleans(),
    backend=st.sampled_from(["numpy", "torch"]),
    seed=st.integers(0, 1000),
)
def test_random_recurrence_programs(n, a, b, c0, kind, out_kind, k, nonlinear, backend, seed):
    """x[t+1] = f(a*x[t] + b*read(u)); y = read'(x); both against a numpy loop."""
    u = np.random.RandomState(seed).randn(n)
    ctx, t, T = ctx_t()
    with ctx:
        U = tl.from_numpy(u, domain=(t,), dtype="float64")
        x = tl.RecurrentTensor.placeholder((), dtype="float64", domain=(t,))
        x[0] = c0
        body = x[t] * a + _tl_read(U, kind, k, t, T) * b
        x[t + 1] = body.tanh() if nonlinear else body
        y = _tl_read(x, out_kind, k, t, T) if out_kind != "next" else x[tl.min(t + 1, T - 1)]
    gx, gy = tl.evaluate([x, y], backend=backend)
    want = [c0]
    for p in range(n - 1):
        v = a * want[-1] + b * _np_read(u, kind, k, p)
        want.append(np.tanh(v) if nonlinear else v)
    want = np.array(want)
    if out_kind == "next":
        want_y = np.array([want[min(p + 1, n - 1)] for p in range(n)])
    else:
        want_y = np.array([_np_read(want, out_kind, k, p) for p in range(n)])
    close(gx, want, rtol=1e-9, atol=1e-9)
    close(gy, want_y, rtol=1e-9, atol=1e-9)


def test_explain_shows_passes_loops_and_frees():
    ctx, t, T = ctx_t()
    with ctx:
        x = tl.RecurrentTensor.placeholder((4,), domain=(t,), name="state")
        x[0] = tl.zeros((4,))
        x[t + 1] = x * 0.5 + 1.0
        tl.sink(x.sum(), lambda value, point: None)
    prog = ctx.compile(bounds={T: 5})
    text = prog.explain()
    assert "validation" in text and "scheduling" in text
    assert "for t" in text and "state" in text and "free" in text
    assert "state" in prog.render()


def test_state_carried_across_iterations(backend):
    """The first step of iteration i+1 continues from the last step of iteration i."""
    ctx, i, t, I, T = ctx_it()
    with ctx:
        h = tl.RecurrentTensor.placeholder((), domain=(i, t))
        h[0, 0] = 0.0
        h[i + 1, 0] = h[i, T - 1]
        h[i, t + 1] = h[i, t] + 1.0
    got = tl.evaluate(h, bounds={I: 3, T: 4}, backend=backend)
    want = np.zeros((3, 4))
    for a in range(3):
        want[a, 0] = 0.0 if a == 0 else want[a - 1, -1]
        for k in range(3):
            want[a, k + 1] = want[a, k] + 1.0
    close(got, want)


def test_conditions_over_two_dims(backend):
    ctx, i, t, I, T = ctx_it()
    with ctx:
        h = tl.RecurrentTensor.placeholder((), dtype="int64", domain=(i, t))
        h[(i + t).eq(3)] = 7
        h[i > t] = 1
        h[True] = 0
    got = tl.evaluate(h, bounds={I: 3, T: 4}, backend=backend)
    want = [[7 if a + k == 3 else 1 if a > k else 0 for k in range(4)] for a in range(3)]
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("variant", ["schedule", "clip"])
def test_sgd_with_lr_schedule_and_gradient_clipping(variant, backend):
    target = np.array([0.5, -1.5])
    steps = 6
    ctx = tl.Context(dims=("i",))
    (i,), (I,) = ctx.dims, ctx.bounds
    with ctx:
        tgt = tl.from_numpy(target, dtype="float64")
        w = tl.RecurrentTensor.placeholder((2,), dtype="float64", domain=(i,), requires_grad=True)
        w[0] = tl.ones((2,), dtype="float64")
        loss = ((w - tgt) ** 2).sum()
        loss.backward()
        if variant == "schedule":
            opt = tl.optim.SGD([w], lr=lambda it: 0.3 / (tl.full((), it, "float64") + 1.0))
        else:
            opt = tl.optim.SGD([w], lr=0.2, max_grad_norm=0.5)
        opt.step()
    got = tl.evaluate(w, bounds={I: steps}, backend=backend)
    ws = [np.ones(2)]
    for k in range(steps - 1):
        g = 2 * (ws[-1] - target)
        if variant == "schedule":
            ws.append(ws[-1] - 0.3 / (k + 1) * g)
        else:
            scale = min(1.0, 0.5 / (np.linalg.norm(g) + 1e-6))
            ws.append(ws[-1] - 0.2 * g * scale)
    close(got, np.stack(ws), rtol=1e-6, atol=1e-6)


SPATIAL_KEYS = {
    "negative": (lambda U, t: U[t, -1], lambda a: a[-1]),
    "ellipsis": (lambda U, t: U[t, ..., 0], lambda a: a[..., 0]),
    "newaxis": (lambda U, t: U[t, None, 1], lambda a: a[None, 1]),
    "step": (lambda U, t: U[t, :, ::2], lambda a: a[:, ::2]),
    "negative_slices": (lambda U, t: U[t, -2:, 1:-1], lambda a: a[-2:, 1:-1]),
}


@pytest.mark.parametrize("key", sorted(SPATIAL_KEYS))
def test_numpy_style_spatial_indexing(key, backend):
    u = np.arange(24.0, dtype=np.float32).reshape(2, 3, 4)
    build, ref = SPATIAL_KEYS[key]
    ctx, t, T = ctx_t()
    with ctx:
        U = tl.from_numpy(u, domain=(t,))
        got = tl.evaluate(build(U, t), backend=backend)
    close(got, np.stack([ref(u[k]) for k in range(2)]))


@pytest.mark.parametrize("kind", ["last", "window", "lag2", "first"])
def test_bounded_reads_keep_memory_bounded(kind, backend):
    def peak(steps):
        ctx, t, T = ctx_t()
        seen = []
        with ctx:
            x = tl.RecurrentTensor.placeholder((256,), dtype="float64", domain=(t,))
            x[0] = tl.zeros((256,), dtype="float64")
            x[t + 1] = x[t] * 0.5 + 1.0
            if kind == "last":
                r = x[T - 1].sum()
            elif kind == "window":
                r = x[tl.max(t - 3, 0) : t + 1].sum()
            elif kind == "lag2":
                r = x[tl.max(t - 2, 0)].sum()
            else:
                r = (x - x[0]).sum()
            tl.sink(r, lambda value, point: seen.append(float(value)))
        prog = ctx.compile(bounds={T: steps}, backend=backend)
        prog.run()
        rows = [256 * (2 - 2.0 ** (1 - k)) if k else 0.0 for k in range(steps)]
        if kind == "last":
            want = [rows[-1]]
        elif kind == "window":
            want = [sum(rows[max(k - 3, 0) : k + 1]) for k in range(steps)]
        elif kind == "lag2":
            want = [rows[max(k - 2, 0)] for k in range(steps)]
        else:
            want = rows
        np.testing.assert_allclose(seen, want, rtol=1e-9, atol=1e-6)
        return prog.stats()["peak_bytes"]

    short, long = peak(50), peak(500)
    assert long <= short * 1.1 + 4096, (short, long)


def test_state_carried_across_iterations_keeps_memory_bounded(backend):
    """``x[i + 1, 0] = x[i, T - 1]`` (a rollout continuing into the next iteration) pins one
    point of each iteration; every other point is freed inside the t loop, not at its end."""

    def peak(steps):
        ctx, i, t, I, T = ctx_it()
        seen = []
        with ctx:
            x = tl.RecurrentTensor.placeholder((256,), dtype="float64", domain=(i, t))
            x[0, 0] = tl.zeros((256,), dtype="float64")
            y = (x * 2.0).named("y")  # read at every point, and across iterations below
            x[i, t + 1] = y * 0.25 + 1.0
            x[i + 1, 0] = y[i, T - 1]
            last = y[i, T - 1].sum()
            tl.sink(last, lambda value, point: seen.append(float(value)))
        prog = ctx.compile(bounds={I: 3, T: steps}, backend=backend)
        prog.run()
        want, v = [], 0.0
        for _ in range(3):
            for _ in range(steps - 1):
                v = v * 0.5 + 1.0
            want.append(512 * v)
            v = v * 2.0
        np.testing.assert_allclose(seen, want, rtol=1e-12)
        return prog.stats()["peak_bytes"]

    short, long = peak(20), peak(400)
    assert long <= short * 1.1 + 4096, (short, long)


def test_iteration_reads_previous_iteration_ahead(backend):
    u = np.arange(4.0, dtype=np.float32)
    ctx, i, t, I, T = ctx_it()
    with ctx:
        U = tl.from_numpy(u, domain=(t,))
        h = tl.RecurrentTensor.placeholder((), domain=(i, t))
        h[0, t] = U
        h[i + 1, t] = h[i, t] * 2.0 + h[i, tl.min(t + 1, T - 1)]
    got = tl.evaluate(h, bounds={I: 3}, backend=backend)
    want = [u]
    for _ in range(2):
        prev = want[-1]
        want.append(np.array([prev[k] * 2 + prev[min(k + 1, 3)] for k in range(4)]))
    np.testing.assert_allclose(got, np.stack(want))
