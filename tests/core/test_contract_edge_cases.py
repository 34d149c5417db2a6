"""Edge cases of the contract: higher-order and 2-D recurrences, PyTorch-like operators,
indexing after temporal slices, and the errors bad programs must get.

Values are checked against plain numpy/torch computations written out by hand.
"""

from __future__ import annotations

import numpy as np
import pytest
from core_helpers import check_temporal_slice_gradient, ctx_it, ctx_t

import timerl as tl
from timerl.symbolic import Dim, max_, min_


def test_second_order_recurrence_fibonacci(backend):
    ctx, t, T = ctx_t()
    with ctx:
        f = tl.RecurrentTensor.placeholder((), dtype="int64", domain=(t,))
        f[0] = 0
        f[1] = 1
        f[t + 2] = f[t + 1] + f[t]
    got = tl.evaluate(f, bounds={T: 15}, backend=backend)
    want = [0, 1]
    for _ in range(13):
        want.append(want[-1] + want[-2])
    np.testing.assert_array_equal(got, want)


def test_min_of_expression_and_its_successor_simplifies():
    t = Dim("t")
    m = min_(0, t.bound)
    assert min_(m, m + 1) == m
    assert max_(max_(0, t), max_(0, t) + 1) == max_(0, t) + 1


def test_torch_backward_of_scalar_sum():
    ctx, t, T = ctx_t()
    with ctx:
        u = tl.from_numpy(np.arange(4.0), domain=(t,), requires_grad=True, dtype="float64")
        loss = (u * u).sum()  # u is 0-d at each point: sum over no axes
        loss.backward()
        g = tl.evaluate(u.grad, backend="torch")
    np.testing.assert_allclose(g, 2 * np.arange(4.0))


def test_pow_method_mirrors_pytorch(backend):
    ctx, t, T = ctx_t()
    with ctx:
        u = tl.from_numpy(np.arange(5.0), domain=(t,))
        got = tl.evaluate(u.pow(3), backend=backend)
    np.testing.assert_allclose(got, np.arange(5.0) ** 3)


def test_spatial_index_after_temporal_slice(backend):
    u = np.arange(12.0, dtype=np.float32).reshape(4, 3)
    ctx, t, T = ctx_t()
    with ctx:
        U = tl.from_numpy(u, domain=(t,))
        col = U[0 : t + 1, 0]  # column 0 of every row up to t
    got = tl.evaluate(col, backend=backend)
    want = [u[: k + 1, 0] for k in range(4)]
    assert isinstance(got, list) and len(got) == 4
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g, w)


def test_non_affine_index_is_a_timerl_error():
    ctx, t, T = ctx_t()
    with ctx:
        x = tl.RecurrentTensor.placeholder((), domain=(t,), name="square_read")
        x[True] = 1.0
        with pytest.raises(tl.TimerlError):
            x[t * t]


def test_assignment_shape_error_points_at_user_line():
    ctx, t, T = ctx_t()
    with ctx:
        x = tl.RecurrentTensor.placeholder((3,), domain=(t,), name="state")
        with pytest.raises(tl.ShapeError) as info:
            x[0] = tl.zeros((4,))
    assert "test_contract_edge_cases.py" in str(info.value)


def test_undefined_read_message_names_reader_and_points():
    ctx, t, T = ctx_t()
    with ctx:
        x = tl.RecurrentTensor.placeholder((), domain=(t,), name="only_one")
        x[1] = 1.0
        y = (x[0] * 2.0).named("reader")
    with pytest.raises(tl.UndefinedPointError) as info:
        ctx.compile(bounds={T: 5}, outputs=[y])
    msg = str(info.value)
    assert "reader" in msg and "[0, 4]" not in msg


def test_floordiv_and_mod_on_tensors(backend):
    ctx, t, T = ctx_t()
    with ctx:
        u = tl.from_numpy(np.arange(-3, 6), domain=(t,))
        q, r = u // 4, u % 4
        got_q, got_r = tl.evaluate([q, r], backend=backend)
    np.testing.assert_array_equal(got_q, np.arange(-3, 6) // 4)
    np.testing.assert_array_equal(got_r, np.arange(-3, 6) % 4)


def test_validation_is_exact_for_large_domains():
    ctx, i, t, I, T = ctx_it()
    with ctx:
        x = tl.RecurrentTensor.placeholder((), domain=(i, t), name="x")
        x[True] = 1.0
        y = tl.RecurrentTensor.placeholder((), domain=(i, t), name="late_reader")
        y[t < 1000] = 1.0
        y[True] = x[i, t + 1]
    # the same program at a small I is rejected: the fault does not depend on I
    with pytest.raises(tl.OutOfRangeError):
        ctx.compile(bounds={I: 10, T: 1500}, outputs=[y])
    with pytest.raises(tl.OutOfRangeError):
        ctx.compile(bounds={I: 1500, T: 1500}, outputs=[y])


def test_two_dim_recurrence_pascal_triangle(backend):
    ctx, i, t, I, T = ctx_it()
    with ctx:
        h = tl.RecurrentTensor.placeholder((), domain=(i, t))
        h[0, t] = 1.0
        h[i, 0] = 1.0
        h[i + 1, t + 1] = h[i, t + 1] + h[i + 1, t]
    got = tl.evaluate(h, bounds={I: 5, T: 5}, backend=backend)
    want = np.ones((5, 5))
    for a in range(1, 5):
        for k in range(1, 5):
            want[a, k] = want[a - 1, k] + want[a, k - 1]
    np.testing.assert_allclose(got, want)


def test_mixing_contexts_is_rejected_when_written():
    c1, c2 = tl.Context(dims=("t",)), tl.Context(dims=("t",))
    with c1:
        x = tl.from_numpy(np.arange(3.0), domain=(c1.dims[0],))
    with c2:
        y = tl.from_numpy(np.arange(3.0), domain=(c2.dims[0],))
        with pytest.raises(tl.ProgramError):
            x + y


def test_gradient_forward_then_backward_recurrence(backend):
    import torch

    n, s0 = 7, np.random.RandomState(41).randn(7)
    ctx, t, T = ctx_t()
    with ctx:
        W = tl.from_numpy(np.array(0.7), requires_grad=True, dtype="float64")
        S = tl.from_numpy(s0, domain=(t,), dtype="float64")
        h = tl.RecurrentTensor.placeholder((), dtype="float64", domain=(t,))
        h[0] = S[0] * W
        h[t + 1] = h * W + S[t + 1]
        adv = tl.RecurrentTensor.placeholder((), dtype="float64", domain=(t,))
        adv[T - 1] = h[T - 1]
        adv[True] = h + 0.9 * adv[t + 1]
        (adv * adv).backward()
        got = tl.evaluate(W.grad, backend=backend)
    tw = torch.tensor(0.7, dtype=torch.float64, requires_grad=True)
    ts = torch.tensor(s0)
    hs = [ts[0] * tw]
    for k in range(n - 1):
        hs.append(hs[-1] * tw + ts[k + 1])
    advs, acc = [None] * n, 0.0
    for k in reversed(range(n)):
        acc = hs[k] + 0.9 * acc
        advs[k] = acc
    (want,) = torch.autograd.grad(sum(a * a for a in advs), [tw])
    np.testing.assert_allclose(got, want.item(), rtol=1e-9)


@pytest.mark.parametrize("variant", ["mul_next_input", "tanh_next_input", "product_of_reads"])
def test_gradient_of_recurrence_reading_next_input(variant, backend):
    import torch

    u = np.random.RandomState(40).randn(6)
    ctx, t, T = ctx_t()
    with ctx:
        U = tl.from_numpy(u, domain=(t,), requires_grad=True, dtype="float64")
        x = tl.RecurrentTensor.placeholder((), dtype="float64", domain=(t,))
        x[0] = U[0]
        if variant == "mul_next_input":
            x[t + 1] = x * U[t + 1]
        elif variant == "tanh_next_input":
            x[t + 1] = (x * 0.7 + U[t + 1]).tanh()
        else:
            x[t + 1] = x + U[t + 1] * U[t]
        x.backward()
        got = tl.evaluate(U.grad, backend=backend)
    tu = torch.tensor(u, requires_grad=True)
    xs = [tu[0]]
    for k in range(5):
        if variant == "mul_next_input":
            xs.append(xs[-1] * tu[k + 1])
        elif variant == "tanh_next_input":
            xs.append(torch.tanh(xs[-1] * 0.7 + tu[k + 1]))
        else:
            xs.append(xs[-1] + tu[k + 1] * tu[k])
    (want,) = torch.autograd.grad(sum(xs), [tu])
    np.testing.assert_allclose(got, want.numpy(), rtol=1e-9, atol=1e-12)


def test_torch_values_have_the_declared_dtype():
    ctx, t, T = ctx_t()
    with ctx:
        a = tl.from_numpy(np.arange(3.0, dtype=np.float32), domain=(t,))
        c = tl.from_numpy(np.arange(3, dtype=np.int64), domain=(t,))
        results = [a + c, c / 2, c * 2.5]
    got = tl.evaluate(results, backend="torch")
    for r, v in zip(results, got, strict=True):
        assert v.dtype == r.dtype, (r, v.dtype)


def test_update_without_detach_is_reported_where_it_is_written():
    """DESIGN section 2: an update that does not detach makes the gradient depend on itself."""
    ctx = tl.Context(dims=("i",))
    (i,), (I,) = ctx.dims, ctx.bounds
    with ctx:
        w = tl.RecurrentTensor.placeholder((), domain=(i,), requires_grad=True, name="w")
        w[0] = 1.0
        (w * w).backward()
        with pytest.raises(tl.CycleError, match=r"w.*detach") as info:
            w[i + 1] = w - 0.1 * w.grad
        assert "test_contract_edge_cases.py" in str(info.value)
        w[i + 1] = w.detach() - 0.1 * w.grad  # the detached update is accepted
    got = tl.evaluate(w, bounds={I: 4})
    np.testing.assert_allclose(got, [1.0, 0.8, 0.64, 0.512])


@pytest.mark.parametrize("kind", ["window", "lookahead", "lookahead_window"])
def test_gradient_through_clamped_temporal_reads(kind, backend):
    check_temporal_slice_gradient(kind, backend)


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
