"""nn modules against numpy with the same weights; optimisers against torch.optim step by step."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import timerl as tl

BACKENDS = ["numpy", "torch"]


def _np_act(name, x):
    return {"tanh": np.tanh, "relu": lambda v: np.maximum(v, 0.0), "sigmoid": _sigmoid}[name](x)


def _sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


@pytest.mark.parametrize("backend", BACKENDS)
def test_linear_forward_matches_numpy(backend):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((5, 3)).astype(np.float32)
    ctx = tl.Context(dims=("i", "t"))
    with ctx:
        lin = tl.nn.Linear(3, 4, seed=1)
        nob = tl.nn.Linear(3, 4, bias=False, seed=2)
        xt = tl.from_numpy(x)
        y, y2 = lin(xt), nob(xt)
    got, got2, w, b, w2 = tl.evaluate(
        [y, y2, lin.weight, lin.bias, nob.weight], bounds={"I": 1}, backend=backend
    )
    assert w.shape == (1, 3, 4) and b.shape == (1, 4)
    assert nob.bias is None and len(nob.parameters()) == 1
    np.testing.assert_allclose(got[0], x @ w[0] + b[0], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got2[0], x @ w2[0], rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(b[0], np.zeros(4))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("activation", ["tanh", "relu", "sigmoid"])
def test_mlp_forward_matches_numpy(activation, backend):
    rng = np.random.default_rng(1)
    x = rng.standard_normal((2, 6, 5)).astype(np.float32)  # over (t,): 2 points, batch 6
    ctx = tl.Context(dims=("i", "t"))
    i, t = ctx.dims
    with ctx:
        mlp = tl.nn.MLP([5, 16, 8, 3], activation=activation, seed=3)
        y = mlp(tl.from_numpy(x, domain=(t,)))
        params = mlp.parameters()
    got, *ps = tl.evaluate([y, *params], bounds={"I": 1}, backend=backend)
    assert len(params) == 6
    assert got.shape == (1, 2, 6, 3)  # (I, T, B, out): the parameters run over i
    h = x.astype(np.float64)
    for k in range(3):
        w, b = ps[2 * k][0], ps[2 * k + 1][0]
        h = h @ w + b
        if k < 2:
            h = _np_act(activation, h)
    np.testing.assert_allclose(got[0], h, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize(
    ("rows", "cols", "gain"), [(4, 4, 1.0), (8, 3, math.sqrt(2)), (3, 8, 0.01)]
)
def test_orthogonal_init_is_orthogonal(rows, cols, gain):
    with tl.Context(dims=("i", "t")):
        lin = tl.nn.Linear(rows, cols, gain=gain, seed=4)
    w = tl.evaluate(lin.weight, bounds={"I": 1})[0].astype(np.float64)
    gram = w.T @ w if rows >= cols else w @ w.T
    np.testing.assert_allclose(gram, gain**2 * np.eye(min(rows, cols)), atol=1e-5)


@pytest.mark.parametrize(("rows", "cols"), [(3000, 64), (64, 3000), (256, 64), (64, 64)])
def test_orthogonal_init_is_the_q_of_the_draw_whatever_the_method(rows, cols):
    """Tall draws go through Cholesky QR, square ones through LAPACK: the Q with R's
    diagonal positive is unique, so both give the same weights."""
    from timerl.ir.prims import orthogonal_array

    got = orthogonal_array(rows, cols, 1.5, np.random.default_rng(9))
    a = np.random.default_rng(9).standard_normal((max(rows, cols), min(rows, cols)))
    q, r = np.linalg.qr(a)
    q *= np.sign(np.diag(r))
    want = 1.5 * (q if rows >= cols else q.T)
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-6)


def test_a_tall_orthogonal_init_holds_its_draw_and_result_only():
    """A first layer over image observations (12,288 x 64): numpy's Householder QR held
    about five copies of its float64 draw."""
    import tracemalloc

    from timerl.ir.prims import orthogonal_array

    rows, cols = 12288, 64
    tracemalloc.start()
    try:
        orthogonal_array(rows, cols, 1.0, np.random.default_rng(0))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak <= rows * cols * (8 + 4) + (1 << 20)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("compiled", [True, False], ids=["generated", "interpreted"])
def test_initial_weights_are_drawn_at_run_time_and_freed(backend, compiled):
    """The program holds a weight's seed, not its initial array: the value read at i == 0 is
    the orthogonal draw of that seed, and no store keeps it after the first iteration."""
    ctx = tl.Context(dims=("i", "t"))
    i, t = ctx.dims
    with ctx:
        lin = tl.nn.Linear(64, 16, seed=5)
        w = lin.weight
        w[i + 1] = w[i] * 0.5  # an update (as an optimiser's)
        s = w[i].sum(0).sum(0)
    prog = ctx.compile(bounds={"I": 3}, outputs=[w, s], backend=backend)
    assert not any(op.prim == "const" and op.attrs["value"].size >= 64 * 16 for op in prog.ops)
    prog.run(compiled=compiled)
    expect = tl.nn.orthogonal(64, 16, math.sqrt(2), np.random.default_rng(5))
    got = np.asarray(prog.value(w))
    np.testing.assert_array_equal(got[0], expect)
    np.testing.assert_allclose(got[2], expect * 0.25, rtol=1e-6)
    init = next(op for op in prog.ops if op.prim == "orthogonal")
    assert not prog._executor().stores[init.id]


def test_init_is_seeded():
    def weights(seed):
        with tl.Context(dims=("i", "t")):
            mlp = tl.nn.MLP([4, 8, 2], seed=seed)
        return tl.evaluate(mlp.parameters(), bounds={"I": 1})

    a, b, c = weights(7), weights(7), weights(8)
    for x, y in zip(a, b, strict=True):
        np.testing.assert_array_equal(x, y)
    assert not np.allclose(a[0], c[0])
    # the layers of one MLP get different weights
    assert not np.allclose(a[0][0][:2, :2], a[2][0][:2, :2])


def test_mlp_rejects_bad_configs():
    with tl.Context(dims=("i", "t")):
        with pytest.raises(tl.ProgramError, match="at least input and output"):
            tl.nn.MLP([4])
        with pytest.raises(tl.ProgramError, match="unknown activation"):
            tl.nn.MLP([4, 2], activation="gelu")


@pytest.mark.parametrize("sizes", [(-3, 4), (3, 0), (3.0, 2), (True, 2)])
def test_linear_rejects_a_size_that_is_not_a_positive_int(sizes):
    bad = r"Linear 'enc': (in|out)_features must be"
    with tl.Context(dims=("i", "t")), pytest.raises(tl.ProgramError, match=bad):
        tl.nn.Linear(*sizes, name="enc")


# --- optimisers --------------------------------------------------------------------------------
N_STEPS, BATCH, D_IN, D_OUT = 12, 16, 3, 2


def _regression_data(seed=0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((N_STEPS, BATCH, D_IN)).astype(np.float32)
    w_true = rng.standard_normal((D_IN, D_OUT)).astype(np.float32) * 3
    y = (x @ w_true + 1.5 + 0.1 * rng.standard_normal((N_STEPS, BATCH, D_OUT))).astype(np.float32)
    return x, y


LR0 = 0.05


def _schedule(i):
    """A linear lr decay over the iteration dim."""
    return (1.0 - tl.full((), i) / tl.full((), i.bound)) * LR0


def _torch_lr(k):
    return (1.0 - k / N_STEPS) * LR0


def _timerl_run(opt_name, max_grad_norm, schedule, backend, **kw):
    x, y = _regression_data()
    ctx = tl.Context(dims=("i",))
    (i,) = ctx.dims
    with ctx:
        lin = tl.nn.Linear(D_IN, D_OUT, seed=11, domain=(i,))
        pred = lin(tl.from_numpy(x, domain=(i,)))
        loss = ((pred - tl.from_numpy(y, domain=(i,))) ** 2.0).mean()
        params = lin.parameters()
        loss.backward(inputs=params)
        lr = _schedule if schedule else LR0
        cls = tl.optim.Adam if opt_name == "adam" else tl.optim.SGD
        cls(params, lr=lr, max_grad_norm=max_grad_norm, **kw).step()
        grads = [p.grad for p in params]
    out = tl.evaluate([loss, *params, *grads], bounds={"I": N_STEPS}, backend=backend)
    return x, y, out[0], out[1:3], out[3:5]


def _torch_run(opt_name, w0, b0, x, y, max_grad_norm, schedule, **kw):
    w = torch.tensor(w0, dtype=torch.float64, requires_grad=True)
    b = torch.tensor(b0, dtype=torch.float64, requires_grad=True)
    if opt_name == "adam":
        opt = torch.optim.Adam([w, b], lr=LR0, **kw)
    else:
        opt = torch.optim.SGD([w, b], lr=LR0)
    losses, ws, bs, gws, gbs = [], [], [], [], []
    for k in range(N_STEPS):
        ws.append(w.detach().numpy().copy())
        bs.append(b.detach().numpy().copy())
        opt.zero_grad()
        pred = torch.tensor(x[k], dtype=torch.float64) @ w + b
        loss = ((pred - torch.tensor(y[k], dtype=torch.float64)) ** 2).mean()
        loss.backward()
        gws.append(w.grad.numpy().copy())
        gbs.append(b.grad.numpy().copy())
        losses.append(loss.item())
        if max_grad_norm is not None:
            torch.nn.utils.clip_grad_norm_([w, b], max_grad_norm)
        if schedule:
            for group in opt.param_groups:
                group["lr"] = _torch_lr(k)
        opt.step()
    return np.array(losses), [np.stack(ws), np.stack(bs)], [np.stack(gws), np.stack(gbs)]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(
    ("opt_name", "max_grad_norm", "schedule", "kw"),
    [
        ("adam", None, False, {}),
        ("adam", 0.5, True, {}),
        ("adam", 1.0, False, {"betas": (0.8, 0.99), "eps": 1e-5}),
        ("sgd", None, False, {}),
        ("sgd", 0.5, True, {}),
    ],
    ids=["adam", "adam-clip-sched", "adam-betas-eps", "sgd", "sgd-clip-sched"],
)
def test_optimizer_matches_torch_step_by_step(opt_name, max_grad_norm, schedule, kw, backend):
    x, y, loss, params, grads = _timerl_run(opt_name, max_grad_norm, schedule, backend, **kw)
    w0, b0 = params[0][0], params[1][0]
    ref_loss, ref_params, ref_grads = _torch_run(
        opt_name, w0, b0, x, y, max_grad_norm, schedule, **kw
    )
    assert params[0].shape == (N_STEPS, D_IN, D_OUT)
    if max_grad_norm is not None:  # the clipping is actually exercised
        norms = np.sqrt(sum((g**2).sum(axis=tuple(range(1, g.ndim))) for g in ref_grads))
        assert (norms > max_grad_norm).any()
    for k in range(N_STEPS):
        for got, want in zip(params, ref_params, strict=True):
            np.testing.assert_allclose(got[k], want[k], rtol=2e-4, atol=2e-5, err_msg=f"step {k}")
        for got, want in zip(grads, ref_grads, strict=True):
            np.testing.assert_allclose(got[k], want[k], rtol=2e-4, atol=2e-4, err_msg=f"grad {k}")
    np.testing.assert_allclose(loss, ref_loss, rtol=2e-4, atol=1e-5)
    if max_grad_norm is None:
        assert loss[-1] < loss[0]  # it optimises


def test_optimizer_rejects_non_parameters():
    ctx = tl.Context(dims=("i",))
    with ctx:
        x = tl.from_numpy(np.ones(3, np.float32))
        with pytest.raises(tl.ProgramError, match="requires_grad"):
            tl.optim.SGD([x], lr=0.1)
        with pytest.raises(tl.ProgramError, match="no parameters"):
            tl.optim.Adam([], lr=0.1)


@pytest.mark.parametrize(
    ("make", "why"),
    [
        (lambda ps: tl.optim.Adam(ps, lr=-1.0), "Adam: lr must be a number >= 0"),
        (lambda ps: tl.optim.SGD(ps, lr="fast"), "SGD: lr must be a number >= 0"),
        (lambda ps: tl.optim.SGD(ps, lr=0.1, max_grad_norm=0), "max_grad_norm must be"),
        (lambda ps: tl.optim.Adam(ps, betas=(1.5, 0.9)), r"betas must be two numbers in \[0, 1\)"),
        (lambda ps: tl.optim.Adam(ps, eps=-1e-8), "eps must be a number > 0"),
    ],
)
def test_optimiser_settings_out_of_range_are_named(make, why):
    with tl.Context(dims=("i", "t")) as ctx:
        (i, _t) = ctx.dims
        layer = tl.nn.Linear(3, 2, domain=(i,))
        with pytest.raises(tl.ProgramError, match=why):
            make(layer.parameters())
        # a schedule and numpy scalars are settings too
        tl.optim.Adam(layer.parameters(), lr=lambda i: 1e-3, max_grad_norm=np.float32(0.5))
