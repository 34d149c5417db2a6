"""Valid programs the compiler used to reject (or crash on), checked end to end.

Each test builds the program in timerl, runs it on the backend under test and compares its
values with a plain numpy loop written here, and its gradients with central finite differences
of that loop's loss (float64 throughout, so the differences are accurate to ~1e-8).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import pytest
from core_helpers import close, ctx_it, ctx_t

import timerl as tl


def _arr(*shape: int, seed: int) -> np.ndarray:
    return np.random.RandomState(seed).randn(*shape)


def _fd_grads(
    loss: Callable[..., float], arrays: Sequence[np.ndarray], eps: float = 1e-6
) -> list[np.ndarray]:
    """d loss(*arrays) / d each array, by central differences."""
    grads = []
    for k, a in enumerate(arrays):
        g = np.zeros_like(a)
        for pos in np.ndindex(a.shape):
            args = [b.copy() for b in arrays]
            args[k][pos] += eps
            up = loss(*args)
            args[k][pos] -= 2 * eps
            down = loss(*args)
            g[pos] = (up - down) / (2 * eps)
        grads.append(g)
    return grads


def _check_grads(got: Sequence[np.ndarray], loss, arrays) -> None:
    for g, want in zip(got, _fd_grads(loss, arrays), strict=True):
        close(g, want, rtol=1e-6, atol=1e-7)


# --- 1. two-step forward recurrence -------------------------------------------------------------


def _two_step_ref(ab, u, w, nonlinear):
    n = len(w)
    x = np.zeros(n)
    x[0], x[1] = ab[0], ab[1]
    for k in range(2, n):
        x[k] = x[k - 1] * 0.5 + x[k - 2] * 0.25
        if nonlinear:
            x[k] = np.tanh(x[k] + u[k])
    return x, float((x * x * w).sum())


@pytest.mark.parametrize("nonlinear", [False, True], ids=["linear", "with_input"])
def test_two_step_recurrence(nonlinear, backend):
    n = 7
    ab, u, w = np.array([0.8, -1.3]), _arr(n, seed=1), _arr(n, seed=2)
    ctx, t, T = ctx_t()
    with ctx:
        AB = tl.from_numpy(ab, requires_grad=True, dtype="float64")
        U = tl.from_numpy(u, domain=(t,), requires_grad=True, dtype="float64")
        W = tl.from_numpy(w, domain=(t,), dtype="float64")
        x = tl.RecurrentTensor.placeholder((), "float64", domain=(t,))
        x[0] = AB[0]
        x[1] = AB[1]
        if nonlinear:
            x[t + 2] = (x[t + 1] * 0.5 + x[t] * 0.25 + U[t + 2]).tanh()
        else:
            x[t + 2] = x[t + 1] * 0.5 + x[t] * 0.25
        (x * x * W).sum().backward()
        xv, gab, gu = tl.evaluate([x, AB.grad, U.grad], backend=backend)
    close(xv, _two_step_ref(ab, u, w, nonlinear)[0], rtol=1e-12, atol=1e-12)
    _check_grads([gab, gu], lambda a, b: _two_step_ref(a, b, w, nonlinear)[1], [ab, u])
    if not nonlinear:
        assert not np.any(gu)  # u is not read: its gradient is exactly zero


# --- 2. coupled recurrences ---------------------------------------------------------------------


def _coupled_ref(u, w):
    n = len(u)
    a, b = np.zeros(n), np.zeros(n)
    a[0], b[0] = u[0], 1.0
    for k in range(1, n):
        a[k] = 0.5 * a[k - 1] + b[k - 1]
        b[k] = 0.5 * b[k - 1] + a[k] + np.sin(u[k])
    return a, b, float((a * b * w).sum())


@pytest.mark.parametrize("order", ["a_first", "b_first"])
def test_coupled_recurrences_reading_the_new_point(order, backend):
    n = 6
    u, w = _arr(n, seed=3), _arr(n, seed=4) * 0.1
    ctx, t, T = ctx_t()
    with ctx:
        U = tl.from_numpy(u, domain=(t,), requires_grad=True, dtype="float64")
        W = tl.from_numpy(w, domain=(t,), dtype="float64")
        a = tl.RecurrentTensor.placeholder((), "float64", domain=(t,), name="a")
        b = tl.RecurrentTensor.placeholder((), "float64", domain=(t,), name="b")

        def define_a():
            a[0] = U[0]
            a[t + 1] = 0.5 * a[t] + b[t]

        def define_b():
            b[0] = 1.0
            b[t + 1] = 0.5 * b[t] + a[t + 1] + U[t + 1].sin()

        # b reads a[t + 1], the point a is defining at the same step: defined before or after
        # a, the pair must run as one forward loop
        for define in (define_a, define_b) if order == "a_first" else (define_b, define_a):
            define()
        (a * b * W).sum().backward()
        av, bv, gu = tl.evaluate([a, b, U.grad], backend=backend)
    ra, rb, _ = _coupled_ref(u, w)
    close(av, ra, rtol=1e-12, atol=1e-12)
    close(bv, rb, rtol=1e-12, atol=1e-12)
    _check_grads([gu], lambda x: _coupled_ref(x, w)[2], [u])


# --- 3. max / min over a partial temporal slice -------------------------------------------------


@pytest.mark.parametrize("kind", ["max_prefix", "min_suffix"])
def test_reduction_over_a_partial_slice(kind, backend):
    u = np.array([[1.0, -2.0, 0.5], [3.0, 0.25, -1.0], [2.0, 1.5, 4.0]])  # distinct: no ties

    def ref(x):
        part = x[0:2].max(0) if kind == "max_prefix" else x[1:3].min(0)
        return part, float(part.sum())

    ctx, t, T = ctx_t()
    with ctx:
        U = tl.from_numpy(u, domain=(t,), requires_grad=True, dtype="float64")
        w = U[0:2].max(0) if kind == "max_prefix" else U[1:3].min(0)
        w.backward()
        wv, gu = tl.evaluate([w, U.grad], backend=backend)
    close(wv, ref(u)[0])
    _check_grads([gu], lambda x: ref(x)[1], [u])
    excluded = 2 if kind == "max_prefix" else 0
    assert not np.any(gu[excluded])  # the point outside the slice gets no gradient


# --- 4. a branch's shifted-and-sliced read, guarded by an earlier branch ------------------------


def _branch_ref(u):
    n_i, n_t = u.shape
    y = np.zeros((n_i, n_t))
    for i in range(n_i - 1):
        for t in range(n_t):
            y[i, t] = u[i + 1, t : min(t + 1, n_t)].sum(0)
    return y, float((y**2).sum())


def test_shifted_slice_under_a_branch_condition(backend):
    u = _arr(4, 5, seed=5)
    ctx, i, t, I, T = ctx_it()  # noqa: E741
    with ctx:
        U = tl.from_numpy(u, domain=(i, t), requires_grad=True, dtype="float64")
        y = tl.RecurrentTensor.placeholder((), "float64", domain=(i, t))
        y[i.eq(I - 1)] = 0.0
        y[True] = U[i + 1, t : tl.min(t + 1, T)].sum(0)
        (y**2).sum().backward()
        yv, gu = tl.evaluate([y, U.grad], backend=backend)
    close(yv, _branch_ref(u)[0], rtol=1e-12, atol=1e-12)
    _check_grads([gu], lambda x: _branch_ref(x)[1], [u])


# --- 5. a recurrence over t reading the clamped neighbour and a suffix over i -------------------


def _neighbour_ref(u, n_t):
    n_i = len(u)
    x = np.zeros((n_i, n_t))
    x[:, 0] = 0.5
    for t in range(n_t - 1):
        for i in range(n_i):
            inner = x[i, t] * 0.5 + u[i + 1 :].sum(0) * u[i]
            x[i, t + 1] = np.tanh(inner) + x[min(i + 1, n_i - 1), t] * 0.25
    return x, float((x * x).sum())


def test_clamped_neighbour_and_suffix_gradient(backend):
    u, n_t = _arr(4, seed=6), 5
    ctx, i, t, I, T = ctx_it()  # noqa: E741
    with ctx:
        U = tl.from_numpy(u, domain=(i,), requires_grad=True, dtype="float64")
        x = tl.RecurrentTensor.placeholder((), "float64", domain=(i, t))
        x[i, 0] = 0.5
        x[i, t + 1] = (x[i, t] * 0.5 + U[i + 1 : I].sum(0) * U[i]).tanh() + x[
            tl.min(i + 1, I - 1), t
        ] * 0.25
        (x * x).sum().backward()
        xv, gu = tl.evaluate([x, U.grad], bounds={T: n_t}, backend=backend)
    close(xv, _neighbour_ref(u, n_t)[0], rtol=1e-12, atol=1e-12)
    _check_grads([gu], lambda a: _neighbour_ref(a, n_t)[1], [u])


# --- 6. slices of tensors defined through clamped or modular reads ------------------------------


def _derived_index(kind: str, t, T):
    if kind == "clamp_low":
        return tl.max(t - 1, 0)
    if kind == "clamp_high":
        return tl.min(t + 2, T - 1)
    return t % 3


def _np_index(kind: str, k: int, n: int) -> int:
    if kind == "clamp_low":
        return max(k - 1, 0)
    if kind == "clamp_high":
        return min(k + 2, n - 1)
    return k % 3


def _prefix_ref(u, c, kind):
    n = len(u)
    lag = np.array([u[_np_index(kind, k, n)] for k in range(n)])
    s = np.array([lag[0 : k + 1].sum(0) for k in range(n)])
    return s, float((s * s * c).sum())


@pytest.mark.parametrize("kind", ["clamp_low", "clamp_high", "mod"])
def test_slice_of_a_clamped_or_modular_read(kind, backend):
    n = 7
    u, c = _arr(n, 2, seed=7), _arr(n, 2, seed=8)
    ctx, t, T = ctx_t()
    with ctx:
        U = tl.from_numpy(u, domain=(t,), requires_grad=True, dtype="float64")
        C = tl.from_numpy(c, domain=(t,), dtype="float64")
        lag = U[_derived_index(kind, t, T)]
        s = lag[0 : t + 1].sum(0)
        (s * s * C).sum().backward()
        sv, gu = tl.evaluate([s, U.grad], backend=backend)
    close(sv, _prefix_ref(u, c, kind)[0], rtol=1e-12, atol=1e-12)
    _check_grads([gu], lambda a: _prefix_ref(a, c, kind)[1], [u])


# --- 7. gradients of reads backward() used to refuse ------------------------------------------


def _div_mod_ref(u, c, reads):
    n = len(c)
    y = np.array([np.prod([u[f(k)] for f in reads]) for k in range(n)])
    return y, float((y * y * c).sum())


DIV_MOD_READS = {
    "floordiv": ((lambda t: t // 2), (lambda k: k // 2)),
    "floordiv_offset": ((lambda t: (t + 1) // 3 + 1), (lambda k: (k + 1) // 3 + 1)),
    "mod": ((lambda t: t % 3), (lambda k: k % 3)),
    "floordiv_times_mod": (None, None),
}


@pytest.mark.parametrize("kind", list(DIV_MOD_READS))
def test_floordiv_and_mod_read_gradients(kind, backend):
    n = 8
    u, c = _arr(n, seed=9), _arr(n, seed=10)
    if kind == "floordiv_times_mod":
        tl_reads = [lambda t: t // 2, lambda t: t % 3]
        np_reads = [lambda k: k // 2, lambda k: k % 3]
    else:
        tl_reads, np_reads = [DIV_MOD_READS[kind][0]], [DIV_MOD_READS[kind][1]]
    ctx, t, T = ctx_t()
    with ctx:
        U = tl.from_numpy(u, domain=(t,), requires_grad=True, dtype="float64")
        C = tl.from_numpy(c, domain=(t,), dtype="float64")
        y = U[tl_reads[0](t)]
        for read in tl_reads[1:]:
            y = y * U[read(t)]
        (y * y * C).sum().backward()
        yv, gu = tl.evaluate([y, U.grad], backend=backend)
    close(yv, _div_mod_ref(u, c, np_reads)[0], rtol=1e-12, atol=1e-12)
    _check_grads([gu], lambda a: _div_mod_ref(a, c, np_reads)[1], [u])


RECURRENCE_READS = {
    "next": ((lambda t, T: t + 1), (lambda k, n: k + 1)),
    "clamped_next": ((lambda t, T: tl.min(t + 1, T - 1)), (lambda k, n: min(k + 1, n - 1))),
    "last": ((lambda t, T: T - 1), (lambda k, n: n - 1)),
    "floordiv": ((lambda t, T: t // 2), (lambda k, n: k // 2)),
    "floordiv_offset": ((lambda t, T: (t + 1) // 2), (lambda k, n: (k + 1) // 2)),
    "mod": ((lambda t, T: t % 3), (lambda k, n: k % 3)),
}


@pytest.mark.parametrize("through", ["data", "placeholder"])
@pytest.mark.parametrize("kind", list(RECURRENCE_READS))
def test_recurrence_reading_an_input_through_an_index(kind, through, backend):
    """h[t + 1] = tanh(h[t] + v[read(t)]): the read's gradient (a scatter-add for floor
    division and modulo) runs inside the gradient's own loop. Through a placeholder the
    definition is retimed, and the guards must stay exact for the gradient to compile."""
    n = 7
    u, h0 = _arr(n, seed=11), 0.3
    tl_read, np_read = RECURRENCE_READS[kind]

    def ref(a):
        h = np.zeros(n)
        h[0] = h0
        for k in range(n - 1):
            h[k + 1] = np.tanh(h[k] + 2.0 * a[np_read(k, n)])
        return h, float((h * h).sum())

    ctx, t, T = ctx_t()
    with ctx:
        U = tl.from_numpy(u, domain=(t,), requires_grad=True, dtype="float64")
        if through == "data":
            v = U * 2.0
        else:
            v = tl.RecurrentTensor.placeholder((), "float64", domain=(t,))
            v[True] = U * 2.0
        h = tl.RecurrentTensor.placeholder((), "float64", domain=(t,))
        h[0] = h0
        h[t + 1] = (h[t] + v[tl_read(t, T)]).tanh()
        (h * h).sum().backward()
        hv, gu = tl.evaluate([h, U.grad], backend=backend)
    close(hv, ref(u)[0], rtol=1e-12, atol=1e-12)
    _check_grads([gu], lambda a: ref(a)[1], [u])


def _moving_clamped_ref(h):
    n_i, n_t = h.shape
    return np.array([[h[0 : i + 1, max(t - 1, 0)].sum(0) for t in range(n_t)] for i in range(n_i)])


def _window_2d_ref(h):
    n_i, n_t = h.shape
    return np.array(
        [
            [h[max(i - 1, 0) : i + 1, max(t - 1, 0) : t + 1].sum() for t in range(n_t)]
            for i in range(n_i)
        ]
    )


# a moving slice with a clamped read on another dim; a clamped window over two dims (each
# dim's clamp splits the read into pieces, and at the other pieces' points a piece's gradient
# holds zeros whose other window length differs from its own)
@pytest.mark.parametrize(
    "read, ref",
    [
        (lambda H, i, t: H[0 : i + 1, tl.max(t - 1, 0)].sum(0), _moving_clamped_ref),
        (
            lambda H, i, t: H[tl.max(i - 1, 0) : i + 1, tl.max(t - 1, 0) : t + 1].sum(0).sum(0),
            _window_2d_ref,
        ),
    ],
    ids=["moving-and-clamped", "clamped-window-2d"],
)
def test_slices_with_clamped_reads_and_their_gradients(read, ref, backend):
    h = _arr(3, 5, seed=12)
    ctx, i, t, I, T = ctx_it()  # noqa: E741
    with ctx:
        H = tl.from_numpy(h, domain=(i, t), requires_grad=True, dtype="float64")
        y = read(H, i, t)
        (y * y).sum().backward()
        yv, gh = tl.evaluate([y, H.grad], backend=backend)
    close(yv, ref(h), rtol=1e-12, atol=1e-12)
    _check_grads([gh], lambda a: float((ref(a) ** 2).sum()), [h])


def _backward_max_ref(u):
    n = len(u)
    x = np.zeros(n)
    x[n - 1] = u[n - 1, 0]
    for k in range(n - 2, -1, -1):
        x[k] = np.tanh((x[k + 1] * 0.5 + np.maximum(x[k + 1], u[max(k - 2, 0)])).sum())
    return x, float((x * x).sum())


@pytest.mark.parametrize("n", [2, 5])
def test_backward_recurrence_with_a_clamped_read_beside_it(n, backend):
    # the clamp's pieces split the gradient's guards in two at each round of the recurrence;
    # unless the halves join again, the guard outgrows its size limit and becomes every point,
    # where the maximum's gradient reads x past its end
    u = _arr(n, 2, seed=3)
    ctx, t, T = ctx_t()
    with ctx:
        U = tl.from_numpy(u, domain=(t,), requires_grad=True, dtype="float64")
        x = tl.RecurrentTensor.placeholder((), dtype="float64", domain=(t,))
        x[t.eq(T - 1)] = U[t, 0]
        x[True] = (x[t + 1] * 0.5 + tl.maximum(x[t + 1], U[tl.max(t - 2, 0)])).sum(-1).tanh()
        (x * x).sum().backward()
        xv, gu = tl.evaluate([x, U.grad], backend=backend)
    close(xv, _backward_max_ref(u)[0], rtol=1e-12, atol=1e-12)
    _check_grads([gu], lambda a: _backward_max_ref(a)[1], [u])


# --- a point's index as a value -----------------------------------------------------------------


def test_index_times_tensor_is_a_value_of_its_dtype(backend):
    ctx, t, T = ctx_t()
    with ctx:
        u = tl.from_numpy(np.arange(1.0, 5.0), domain=(t,))
        y = u * (t + 1) + (T - t)
        assert y.dtype == np.float32
        got = tl.evaluate(y, backend=backend)
    k = np.arange(4.0)
    close(got, np.arange(1.0, 5.0) * (k + 1) + (4 - k))


def test_index_plus_float_names_the_way_to_use_an_index_as_a_value():
    ctx, t, T = ctx_t()
    with pytest.raises(tl.TimerlError, match=r"t \+ 1.0.*tl\.full\(\(\), t"):
        t + 1.0  # noqa: B018
    with pytest.raises(tl.TimerlError, match="integer index expression"):
        0.5 * (T - t)  # noqa: B018
    with pytest.raises(tl.TimerlError, match=r"t // 2"):
        t / 2  # noqa: B018


# --- found by differential fuzzing ------------------------------------------------------------


def _pinned_select_ref(u):
    n_i, n_t = u.shape[:2]
    a, b = np.zeros((n_i, n_t)), np.zeros((n_i, n_t))
    for i in range(n_i):
        a[i, 0] = u[i, 0].sum(-1)
        b[i, 0] = u[0, 0:1, 0].sum(0)
        for t in range(n_t - 1):
            a[i, t + 1] = b[i, t]
            b[i, t + 1] = a[i, t + 1]
    return a, b, float((b * b).sum())


def test_coupled_pair_reading_a_partial_slice_at_a_fixed_outer_point(backend):
    """u[0, 0:1, 0]: the slice's gradient is selected where i == 0 and t < 1 only; the select
    must not run where either fails (it raised a raw IndexError at t = 1)."""
    u = _arr(2, 3, 2, seed=13)
    ctx, i, t, I, T = ctx_it()  # noqa: E741
    with ctx:
        U = tl.from_numpy(u, domain=(i, t), requires_grad=True, dtype="float64")
        a = tl.RecurrentTensor.placeholder((), "float64", domain=(i, t))
        b = tl.RecurrentTensor.placeholder((), "float64", domain=(i, t))
        a[i, 0] = U[i, 0].sum(-1)
        a[i, t + 1] = b[i, t]
        b[i, 0] = U[0, 0:1, 0].sum(0)
        b[i, t + 1] = a[i, t + 1]
        (b * b).sum().backward()
        av, bv, gu = tl.evaluate([a, b, U.grad], backend=backend)
    ra, rb, _ = _pinned_select_ref(u)
    close(av, ra, rtol=1e-12, atol=1e-12)
    close(bv, rb, rtol=1e-12, atol=1e-12)
    _check_grads([gu], lambda x: _pinned_select_ref(x)[2], [u])


@pytest.mark.parametrize("n", [2, 3, 5])
def test_two_step_recurrence_whose_step_may_never_apply(n, backend):
    """With T = 2 the x[t + 2] branch applies nowhere: its ops must not run at all."""
    u = _arr(n, 2, seed=14)

    def ref(a):
        x = np.zeros((n, 2))
        x[0], x[1] = a[0], a[1]
        for k in range(2, n):
            x[k] = np.tanh(x[k - 1])
        return x, float((x * x).sum())

    ctx, t, T = ctx_t()
    with ctx:
        U = tl.from_numpy(u, domain=(t,), requires_grad=True, dtype="float64")
        x = tl.RecurrentTensor.placeholder((2,), "float64", domain=(t,))
        x[0] = U[0]
        x[1] = U[1]
        x[t + 2] = x[t + 1].tanh()
        (x * x).sum().backward()
        xv, gu = tl.evaluate([x, U.grad], backend=backend)
    close(xv, ref(u)[0], rtol=1e-12, atol=1e-12)
    _check_grads([gu], lambda a: ref(a)[1], [u])


def _overlapping_branches_ref(u):
    n_i, n_t = u.shape[:2]
    p = np.zeros((n_i, n_t))
    for i in range(n_i):
        for t in range(n_t):
            p[i, t] = u[i, t, 0] if i + t == 0 or t == 0 else u[0, t - 1, 0]
    return p, float((p * p).sum())


def test_last_branch_read_where_the_earlier_ones_fail_on_two_dims(backend):
    """The last branch applies where ``~((i + t == 0) | (t == 0))``; its read over ``t`` alone
    is needed only where ``t != 0``, or it reads ``u[0, -1]`` (it raised OutOfRangeError)."""
    u = _arr(3, 3, 2, seed=16)
    ctx, i, t, I, T = ctx_it()  # noqa: E741
    with ctx:
        U = tl.from_numpy(u, domain=(i, t), requires_grad=True, dtype="float64")
        p = tl.RecurrentTensor.placeholder((), "float64", domain=(i, t))
        p[(i + t).eq(0)] = U[i, t, 0]
        p[t.eq(0)] = U[i, t, 0]
        p[True] = U[0, t - 1, 0]
        (p * p).sum().backward()
        pv, gu = tl.evaluate([p, U.grad], backend=backend)
    close(pv, _overlapping_branches_ref(u)[0], rtol=1e-12, atol=1e-12)
    _check_grads([gu], lambda a: _overlapping_branches_ref(a)[1], [u])


def _chained_rows_ref(u):
    n_i, n_t = u.shape[:2]
    y, x = np.zeros((n_i, n_t)), np.zeros((n_i, n_t, 2))
    for i in range(n_i):
        y[i, 0] = u[i, 0, 0]
        x[i, 0] = u[0, 0] if i == 0 else np.tanh(x[i - 1, n_t - 1])
        for t in range(n_t - 1):
            y[i, t + 1] = np.tanh(y[i, t])
            a = np.where(u[i, t, 0] > 0, x[i, t], np.tanh(x[i, t]))
            b = np.tanh(np.where(u[i, t] > 0, y[i, t + 1], x[i, t]))
            x[i, t + 1] = np.tanh(x[i, t] + a + b)
    return x, float((x * x).sum())


def _chained_rows(u, i, t, T):
    """``(x, U)`` of the program ``_chained_rows_ref`` computes, its loss's gradient built
    (inside the context of dims ``(i, t)``)."""
    U = tl.from_numpy(u, domain=(i, t), requires_grad=True, dtype="float64")
    y = tl.RecurrentTensor.placeholder((), "float64", domain=(i, t))
    y[i, 0] = U[i, 0, 0]
    y[i, t + 1] = y[i, t].tanh()
    x = tl.RecurrentTensor.placeholder((2,), "float64", domain=(i, t))
    x[0, 0] = U[0, 0]
    x[i + 1, 0] = x[i, T - 1].tanh()
    a = tl.where(U[i, t, 0] > 0, x[i, t], x[i, t].tanh())
    b = tl.where(U[i, t] > 0, y[i, t + 1], x[i, t]).tanh()
    x[i, t + 1] = (x[i, t] + a + b).tanh()
    (x * x).sum().backward()
    return x, U


def test_recurrence_over_rows_and_steps_with_branches_on_both(backend):
    """Rows chained end to start (``x[i + 1, 0]`` reads ``x[i, T - 1]``), steps reading
    another recurrence: the gradient's guards compare ``i`` and ``t`` and do not fold. They
    became every point, where ``tanh(x[i, t - 1])`` reads ``t = -1`` (OutOfRangeError); they
    are now capped by the points each op can be computed at."""
    u = _arr(2, 3, 2, seed=17)
    ctx, i, t, _, T = ctx_it()
    with ctx:
        x, U = _chained_rows(u, i, t, T)
        xv, gu = tl.evaluate([x, U.grad], backend=backend)
    close(xv, _chained_rows_ref(u)[0], rtol=1e-12, atol=1e-12)
    _check_grads([gu], lambda v: _chained_rows_ref(v)[1], [u])


def test_a_cap_that_does_not_hold_falls_back_to_every_point(monkeypatch):
    """Where the capped guards are not confirmed on the bounds (as in an invalid program),
    guard inference runs again without caps and validation names the read out of range."""
    import timerl.compiler.guards as guards

    monkeypatch.setattr(guards, "reads_within_guards", lambda *args: False)
    ctx, i, t, _, T = ctx_it()
    with ctx:
        x, U = _chained_rows(_arr(2, 3, 2, seed=17), i, t, T)
        with pytest.raises(tl.OutOfRangeError, match=r"t=t - 1, outside 0\.\.T-1"):
            tl.evaluate([x, U.grad])


MULTI_SLICE_READS = {
    # name: (timerl read of h over (i, t), numpy read at point (i, t) of h with shape (I, T, 2))
    "fixed_and_after": (
        lambda h, i, t, I, T: h[0:I, t + 1 : T].sum(0).sum(0),  # noqa: E741
        lambda h, i, t: h[:, t + 1 :].sum((0, 1)),
    ),
    "prefix_and_prefix": (
        lambda h, i, t, I, T: h[0 : i + 1, 0 : t + 1].sum(0).sum(0),  # noqa: E741
        lambda h, i, t: h[: i + 1, : t + 1].sum((0, 1)),
    ),
    "slice_bounded_by_the_other_dim": (
        lambda h, i, t, I, T: h[t:T, 0 : t + 1].sum(0).sum(0),  # noqa: E741
        lambda h, i, t: h[t:, : t + 1].sum((0, 1)),
    ),
    "slice_and_point_on_one_dim": (
        lambda h, i, t, I, T: h[t:T, t].sum(0) + h[t, t],  # noqa: E741
        lambda h, i, t: h[t:, t].sum(0) + h[t, t],
    ),
    "window_and_suffix_max": (
        lambda h, i, t, I, T: h[tl.max(i - 1, 0) : i + 1, t:T].max(1).sum(0),  # noqa: E741
        lambda h, i, t: h[max(i - 1, 0) : i + 1, t:].max(1).sum(0),
    ),
}


@pytest.mark.parametrize("kind", list(MULTI_SLICE_READS))
def test_read_gathering_two_slices_at_once(kind, backend):
    """Several slices (or a slice and a point) over one read: the gradient peels them one at
    a time; on a square h, reads may use t on i's axis too."""
    h = _arr(4, 4, 2, seed=15)
    tl_read, np_read = MULTI_SLICE_READS[kind]

    def ref(a):
        n_i, n_t = a.shape[:2]
        y = np.array([[np_read(a, i, t) for t in range(n_t)] for i in range(n_i)])
        return y, float((np.tanh(y) * y).sum())

    ctx, i, t, I, T = ctx_it()  # noqa: E741
    with ctx:
        H = tl.from_numpy(h, domain=(i, t), requires_grad=True, dtype="float64")
        y = tl_read(H, i, t, I, T)
        if y.domain != (i, t):  # a read that drops a dim: broadcast it back over (i, t)
            y = y * tl.from_numpy(np.ones(h.shape[:2]), domain=(i, t), dtype="float64")
        (y.tanh() * y).sum().backward()
        yv, gh = tl.evaluate([y, H.grad], backend=backend)
    close(yv, ref(h)[0], rtol=1e-12, atol=1e-12)
    _check_grads([gh], lambda a: ref(a)[1], [h])


# --- 13. the gradient of a backward recurrence with a forward window ---------------------------


def _backward_window_ref(u0, u1):
    n = len(u1)
    x = np.zeros(n)
    x[n - 1] = -u0[0]
    for k in range(n - 2, -1, -1):
        x[k] = np.tanh(x[k + 1] * 0.5 + u1[k : min(k + 3, n)].sum() * 2.0 - 0.5)
    return x, float((x * x).sum())


@pytest.mark.parametrize("n", [2, 3, 6])
def test_backward_recurrence_with_a_window_gradient(n, backend):
    """Found by the fuzzer: the gradient chain's guards grew by one shift per round
    (``t + 2 == T``, ``t + 3 == T``, ...), were widened to every point, and the branch
    reading ``x[t + 1]`` was then computed at ``t = T - 1`` too, out of range. Widened as
    intervals they stop at ``t <= T - 2``."""
    u0, u1 = _arr(n, seed=16), _arr(n, seed=17)
    ctx, t, T = ctx_t()
    with ctx:
        U0 = tl.from_numpy(u0, domain=(t,), requires_grad=True, dtype="float64")
        U1 = tl.from_numpy(u1, domain=(t,), requires_grad=True, dtype="float64")
        x = tl.RecurrentTensor.placeholder((), "float64", domain=(t,))
        x[T - 1] = -(U0[0:1].sum(0))
        # the ``+ 0.0`` and ``+ -0.5`` are as generated: each op is one more step of the chain
        x[t] = ((x[t + 1] * 0.5 + 0.0) + (U1[t : tl.min(t + 3, T)].sum(0) * 2.0 + -0.5)).tanh()
        (x * x).sum().backward()
        for optimize in (True, False):
            xv, g0, g1 = tl.evaluate([x, U0.grad, U1.grad], backend=backend, optimize=optimize)
            close(xv, _backward_window_ref(u0, u1)[0], rtol=1e-12, atol=1e-12)
            _check_grads([g0, g1], lambda a, b: _backward_window_ref(a, b)[1], [u0, u1])


@pytest.mark.parametrize("optimize", [True, False])
def test_two_step_recurrence_through_a_detach(backend, optimize):
    """``softmax`` subtracts its detached max: the step's ops behind the ``detach`` read the
    tensor ahead of their own point too, so they are retimed with the rest (a CycleError
    "reads both earlier and later points" before)."""
    u = _arr(2, 3, seed=17)

    def ref(a):
        x = np.zeros((5, 3))
        x[0], x[1] = a[0], a[1]
        for k in range(2, 5):
            z = np.exp(x[k - 1] - x[k - 1].max())
            x[k] = z / z.sum() + 0.5 * x[k - 2]
        return x, float((x * x).sum())

    ctx, t, T = ctx_t()
    with ctx:
        U = tl.from_numpy(u, requires_grad=True, dtype="float64")
        x = tl.RecurrentTensor.placeholder((3,), "float64", domain=(t,))
        x[0] = U[0]
        x[1] = U[1]
        x[t + 2] = x[t + 1].softmax(-1) + x[t] * 0.5
        (x * x).sum().backward()
    xv, gu = tl.evaluate([x, U.grad], bounds={T: 5}, backend=backend, optimize=optimize)
    close(xv, ref(u)[0], rtol=1e-12, atol=1e-12)
    _check_grads([gu], lambda a: ref(a)[1], [u])
