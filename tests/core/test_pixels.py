"""Convolutional and recurrent programs: values and gradients against torch.autograd (weights
copied into the equivalent torch module) on every backend and against the unoptimised numpy
reference; bad image shapes rejected when the program is built, naming the layer."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F  # noqa: N812 - torch's own name

import timerl as tl

BACKENDS = ["numpy", "torch", "jax"]
rng = np.random.default_rng(0)


@pytest.fixture(params=BACKENDS)
def backend(request):
    if request.param == "jax":
        pytest.importorskip("jax")
    return request.param


def _close(got, want, tol=2e-4):
    """Equal up to float32 rounding, relative to the largest magnitude."""
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    assert got.shape == want.shape, (got.shape, want.shape)
    scale = max(float(np.abs(want).max(initial=0.0)), 1e-3)
    assert float(np.abs(got - want).max(initial=0.0)) <= tol * scale, (got, want)


def _run(outputs, backend, params=()):
    """The optimised run on ``backend``, checked against the unoptimised numpy reference."""
    got = tl.evaluate(list(outputs) + list(params), backend=backend)
    ref = tl.evaluate(list(outputs), backend="numpy", optimize=False)
    for g, r in zip(got[: len(outputs)], ref, strict=True):
        _close(g, r, 1e-5)
    return got[: len(outputs)], got[len(outputs) :]


def _leaf(a):
    return torch.tensor(np.asarray(a, np.float64), requires_grad=True)


# --- primitives --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("shape", "kernel", "stride", "padding"),
    [((2, 3, 9, 11), (4, 3, 3, 2), (2, 1), (1, 0)), ((5, 7, 7), (2, 5, 4, 4), 3, 2)],
)
def test_conv2d_and_its_gradients_match_torch(backend, shape, kernel, stride, padding):
    x, w = rng.standard_normal(shape), rng.standard_normal(kernel)
    with tl.Context(dims=("t",)):
        tx = tl.from_numpy(x, requires_grad=True, dtype="float64")
        tw = tl.from_numpy(w, requires_grad=True, dtype="float64")
        y = tl.conv2d(tx, tw, stride, padding)
        loss = (y.tanh() * y).sum()
        loss.backward()
        (val, gx, gw), _ = _run([loss, tx.grad, tw.grad], backend)
    lx, lw = _leaf(x), _leaf(w)
    batched = lx if lx.ndim == 4 else lx.unsqueeze(0)
    ty = F.conv2d(batched, lw, stride=stride, padding=padding)
    tloss = (ty.tanh() * ty).sum()
    for got, want in zip(
        (val, gx, gw), (tloss, *torch.autograd.grad(tloss, [lx, lw])), strict=True
    ):
        _close(got, want.detach().numpy(), 1e-9)


def test_max_pool2d_and_its_gradient_match_torch(backend):
    x = rng.standard_normal((2, 2, 3, 9, 8))
    with tl.Context(dims=("t",)):
        tx = tl.from_numpy(x, requires_grad=True, dtype="float64")
        y = tl.max_pool2d(tx, 3, 2, 1)
        loss = (y * y.sin()).sum()
        loss.backward()
        (val, gx), _ = _run([loss, tx.grad], backend)
    lx = _leaf(x)
    ty = F.max_pool2d(lx.reshape(4, 3, 9, 8), 3, 2, 1)
    tloss = (ty * ty.sin()).sum()
    _close(val, tloss.detach().numpy(), 1e-9)
    _close(gx, torch.autograd.grad(tloss, [lx])[0].numpy(), 1e-9)


# --- layers: weights copied into the equivalent torch module -----------------------------------


def _torch_conv(x, conv, values):
    w, b = (torch.tensor(np.asarray(v, np.float64), requires_grad=True) for v in values)
    return F.conv2d(x, w, b, stride=conv.stride, padding=conv.padding), [w, b]


def _torch_linear(x, values):
    w, b = (torch.tensor(np.asarray(v, np.float64), requires_grad=True) for v in values)
    return x @ w + b, [w, b]


def _layer_grads(net, obs, backend, batch_shape):
    """timerl's output and parameter gradients of ``sum(net(obs) ** 2)``, and the weights."""
    with tl.Context(dims=("t",)):
        built = net()
        y = built(tl.from_numpy(obs))
        assert tuple(y.shape[: len(batch_shape)]) == batch_shape
        loss = (y * y).sum()
        loss.backward()
        params = built.parameters()
        got, values = _run([y] + [p.grad for p in params], backend, params)
    return built, got, values


def test_nature_cnn_on_uint8_frames_matches_torch(backend):
    obs = rng.integers(0, 256, (2, 3, 4, 36, 36), dtype=np.uint8)  # (steps, envs, C, H, W)
    net, got, values = _layer_grads(
        lambda: tl.nn.NatureCNN(4, 36, out_features=16, seed=3), obs, backend, (2, 3)
    )
    x = torch.tensor(obs.reshape(6, 4, 36, 36), dtype=torch.float64) / 255.0
    leaves = []
    for k, conv in enumerate(net.convs):
        x, ws = _torch_conv(x, conv, values[2 * k : 2 * k + 2])
        x, leaves = x.relu(), leaves + ws
    y, ws = _torch_linear(x.flatten(1), values[6:8])
    y = y.relu()
    grads = torch.autograd.grad((y * y).sum(), leaves + ws)
    _close(got[0], y.detach().numpy().reshape(2, 3, 16))
    for g, w in zip(got[1:], grads, strict=True):
        _close(g, w.numpy())


def test_minatar_cnn_on_binary_planes_matches_torch(backend):
    """The MinAtar net: conv 16 3x3, ReLU, flatten, linear, ReLU; 0/1 planes are not scaled."""
    obs = rng.integers(0, 2, (2, 3, 4, 10, 10)).astype(np.float32)  # (steps, envs, C, H, W)
    net, got, values = _layer_grads(
        lambda: tl.nn.MinAtarCNN(4, 10, out_features=12, seed=2), obs, backend, (2, 3)
    )
    assert [tuple(v.shape) for v in values] == [(16, 4, 3, 3), (16,), (16 * 8 * 8, 12), (12,)]
    x = torch.tensor(obs.reshape(6, 4, 10, 10), dtype=torch.float64)
    x, conv_ws = _torch_conv(x, net.conv, values[:2])
    y, linear_ws = _torch_linear(x.relu().flatten(1), values[2:])
    y = y.relu()
    grads = torch.autograd.grad((y * y).sum(), conv_ws + linear_ws)
    _close(got[0], y.detach().numpy().reshape(2, 3, 12))
    for g, w in zip(got[1:], grads, strict=True):
        _close(g, w.numpy())


def test_impala_cnn_matches_torch(backend):
    obs = rng.integers(0, 256, (3, 3, 12, 12), dtype=np.uint8)
    net, got, values = _layer_grads(
        lambda: tl.nn.ImpalaCNN(3, 12, channels=(4, 6, 6), out_features=8, seed=5),
        obs,
        backend,
        (3,),
    )
    x = torch.tensor(obs, dtype=torch.float64) / 255.0
    leaves, k = [], 0

    def conv(x, layer):
        nonlocal k, leaves
        y, ws = _torch_conv(x, layer, values[k : k + 2])
        k, leaves = k + 2, leaves + ws
        return y

    for layer in net.stacks:
        if isinstance(layer, tl.nn.Conv2d):
            x = conv(x, layer)
        elif isinstance(layer, tl.nn.MaxPool2d):
            x = F.max_pool2d(x, 3, 2, 1)
        else:
            x = x + conv(conv(x.relu(), layer.conv0).relu(), layer.conv1)
    y, ws = _torch_linear(x.flatten(1).relu(), values[k : k + 2])
    y = y.relu()
    grads = torch.autograd.grad((y * y).sum(), leaves + ws)
    _close(got[0], y.detach().numpy())
    assert len(got) - 1 == len(grads)
    for g, w in zip(got[1:], grads, strict=True):
        _close(g, w.numpy())


def _torch_cell(kind, values):
    """torch's cell with timerl's weights (its ``weight_ih`` is timerl's transposed)."""
    cell = {"lstm": torch.nn.LSTMCell, "gru": torch.nn.GRUCell}[kind](3, 5).double()
    w_ih, w_hh, b_ih, b_hh = (np.asarray(v, np.float64) for v in values)
    with torch.no_grad():
        cell.weight_ih.copy_(torch.tensor(w_ih.T))
        cell.weight_hh.copy_(torch.tensor(w_hh.T))
        cell.bias_ih.copy_(torch.tensor(b_ih + 0.1))  # nonzero biases: checked as well
        cell.bias_hh.copy_(torch.tensor(b_hh - 0.2))
    return cell


@pytest.mark.parametrize("kind", ["lstm", "gru"])
def test_recurrent_cell_through_time_matches_torch(backend, kind):
    """``h[t + 1] = cell(x[t], h[t])`` over 6 steps, trained by backpropagation through time."""
    steps, xs = 6, rng.standard_normal((6, 2, 3)).astype(np.float32)
    width = 10 if kind == "lstm" else 5
    h0 = rng.standard_normal((2, width)).astype(np.float32)
    ctx = tl.Context(dims=("t",))
    (t,), (big_t,) = ctx.dims, ctx.bounds
    with ctx:
        cell = (tl.nn.LSTMCell if kind == "lstm" else tl.nn.GRUCell)(3, 5, seed=2)
        cell.bias_ih[True] = tl.from_numpy(np.full(cell.bias_ih.shape, 0.1, np.float32))
        cell.bias_hh[True] = tl.from_numpy(np.full(cell.bias_hh.shape, -0.2, np.float32))
        x = tl.from_numpy(xs, domain=(t,), requires_grad=True)
        h = tl.RecurrentTensor.placeholder((2, width), domain=(t,))
        h[0] = tl.from_numpy(h0)
        h[t + 1] = cell.packed(x[t], h[t]) if kind == "lstm" else cell(x[t], h[t])
        loss = (h * h.tanh()).sum()
        loss.backward()
        params = cell.parameters()
        outs = [h[0:big_t], x.grad] + [p.grad for p in params]
        got = tl.evaluate(outs + params, bounds={big_t: steps}, backend=backend)
        ref = tl.evaluate(outs, bounds={big_t: steps}, backend="numpy", optimize=False)
    for g, r in zip(got[: len(outs)], ref, strict=True):
        _close(g, r, 1e-5)
    values = [v - off for v, off in zip(got[-4:], (0, 0, 0.1, -0.2), strict=True)]
    tc = _torch_cell(kind, values)
    tx = _leaf(xs)
    state = torch.tensor(h0, dtype=torch.float64)
    hs = [state]
    for k in range(steps - 1):
        if kind == "lstm":
            hh, cc = tc(tx[k], (state[:, :5], state[:, 5:]))
            state = torch.cat([hh, cc], -1)
        else:
            state = tc(tx[k], state)
        hs.append(state)
    tloss = sum((s * s.tanh()).sum() for s in hs)
    weights = [tc.weight_ih, tc.weight_hh, tc.bias_ih, tc.bias_hh]
    want = torch.autograd.grad(tloss, [tx, *weights])
    _close(got[0], torch.stack(hs).detach().numpy())
    _close(got[1], want[0].numpy())
    for g, w, transposed in zip(got[2:6], want[1:], (True, True, False, False), strict=True):
        _close(g, (w.T if transposed else w).numpy())


def test_conv_over_a_rollout_vectorised_over_t_matches_torch(backend):
    """A conv read at each step ``t`` of a recurrent rollout, and its weight gradient summed
    over the steps: the same as torch's over the stacked frames."""
    steps = 5
    frames = rng.integers(0, 256, (steps, 2, 3, 10, 10), dtype=np.uint8)
    ctx = tl.Context(dims=("t",))
    (t,), (big_t,) = ctx.dims, ctx.bounds
    with ctx:
        conv = tl.nn.Conv2d(3, 4, 3, stride=2, padding=1, seed=7)
        obs = tl.from_numpy(frames, domain=(t,))
        z = tl.RecurrentTensor.placeholder((2,), domain=(t,))
        z[0] = tl.zeros((2,))
        feat = conv(obs[t]).relu().sum((1, 2, 3))  # per step: (envs,)
        z[t + 1] = z[t] * 0.5 + feat * 0.01
        loss = (z * z).sum()
        loss.backward()
        params = conv.parameters()
        outs = [z[0:big_t]] + [p.grad for p in params]
        got = tl.evaluate(outs + params, bounds={big_t: steps}, backend=backend)
        ref = tl.evaluate(outs, bounds={big_t: steps}, backend="numpy", optimize=False)
        prog = ctx.compile(outputs=outs, bounds={big_t: steps}, backend="numpy")
    for g, r in zip(got[: len(outs)], ref, strict=True):
        _close(g, r, 1e-5)
    # one convolution over every step's frames: the loop over t vectorised into its batch
    convs = [op for op in prog.ops if op.prim == "conv2d"]
    assert [(op.domain, tuple(map(str, op.shape[:2]))) for op in convs] == [((), (str(steps), "2"))]
    x = torch.tensor(frames.reshape(steps * 2, 3, 10, 10), dtype=torch.float64)
    y, ws = _torch_conv(x, conv, got[-2:])
    feat = y.relu().sum((1, 2, 3)).reshape(steps, 2)
    zs = [torch.zeros(2, dtype=torch.float64)]
    for k in range(steps - 1):
        zs.append(zs[-1] * 0.5 + feat[k] * 0.01)
    tloss = sum((v * v).sum() for v in zs)
    _close(got[0], torch.stack(zs).detach().numpy())
    for g, w in zip(got[1:3], torch.autograd.grad(tloss, ws), strict=True):
        _close(g, w.numpy())


# --- bad input ----------------------------------------------------------------------------------


def _image(shape, dtype=np.uint8):
    return tl.from_numpy(np.zeros(shape, dtype))


@pytest.mark.parametrize(
    ("make", "shape", "match"),
    [
        (
            lambda: tl.nn.Conv2d(4, 8, 3, name="enc"),
            (2, 3, 10, 10),
            r"'enc'.*4 input channels.*3, 10, 10",
        ),
        (
            lambda: tl.nn.Conv2d(4, 8, 5, name="enc"),
            (2, 4, 3, 9),
            r"'enc'.*kernel \(5, 5\) is larger.*\(3, 9\)",
        ),
        (
            lambda: tl.nn.Conv2d(4, 8, 5, padding=1, name="enc"),
            (4, 2, 3),
            r"'enc'.*padded input \(4, 5\)",
        ),
        (lambda: tl.nn.Conv2d(4, 8, 3, name="enc"), (4, 10), r"'enc'.*expected an image"),
        (
            lambda: tl.nn.NatureCNN(4, 84, name="trunk"),
            (2, 4, 64, 64),
            r"'trunk'.*\(84, 84\).*\(64, 64\)",
        ),
        (
            lambda: tl.nn.NatureCNN(4, 84, name="trunk"),
            (2, 1, 84, 84),
            r"'trunk'.*4 input channels",
        ),
        (lambda: tl.nn.MaxPool2d(3, name="p"), (1, 2, 2), r"'p'.*larger than its padded input"),
        (
            lambda: tl.nn.NatureCNN(4, 84, name="trunk"),
            (2, 4, 10, 10),
            r"'trunk'.*\(84, 84\).*\(10, 10\)",
        ),
        (
            lambda: tl.nn.MinAtarCNN(4, 10, name="planes"),
            (2, 10, 10, 4),  # channels last: the policy transposes MinAtar's (H, W, C) first
            r"'planes'.*4 input channels.*\(2, 10, 10, 4\)",
        ),
        (
            lambda: tl.nn.MinAtarCNN(4, 10, name="planes"),
            (2, 4, 8, 8),
            r"'planes'.*\(10, 10\).*\(8, 8\)",
        ),
    ],
)
def test_an_image_that_does_not_fit_is_rejected_when_built(make, shape, match):
    with tl.Context(dims=("t",)):
        layer = make()
        with pytest.raises(tl.ShapeError, match=match):
            layer(_image(shape))


@pytest.mark.parametrize(
    ("make", "match"),
    [
        (
            lambda: tl.nn.Conv2d(4, 8, 3, stride=0, name="c"),
            r"'c'.*stride must be positive.*\(0, 0\)",
        ),
        (lambda: tl.nn.Conv2d(4, 8, 3, padding=-1, name="c"), r"'c'.*padding.*\(-1, -1\)"),
        (lambda: tl.nn.Conv2d(4, 8, (3, 3, 3), name="c"), r"'c'.*kernel_size.*pair"),
        (lambda: tl.nn.MaxPool2d(3, padding=2, name="p"), r"'p'.*padding \(2, 2\) exceeds half"),
        (lambda: tl.nn.NatureCNN(4, 30, name="n"), r"'n.2'.*kernel \(3, 3\) is larger.*\(2, 2\)"),
        # MinAtar's 10x10: too small for the Atari trunk, refused at its second conv
        (lambda: tl.nn.NatureCNN(4, 10, name="n"), r"'n.1'.*kernel \(4, 4\) is larger.*\(1, 1\)"),
        (lambda: tl.nn.MinAtarCNN(4, 2, name="m"), r"'m.0'.*kernel \(3, 3\) is larger.*\(2, 2\)"),
    ],
)
def test_a_layer_whose_stride_padding_or_size_cannot_fit_is_rejected(make, match):
    with tl.Context(dims=("t",)), pytest.raises((tl.ProgramError, tl.ShapeError), match=match):
        make()


def test_the_primitive_names_its_operands_when_the_weights_do_not_fit():
    with tl.Context(dims=("t",)):
        x = tl.from_numpy(np.zeros((2, 3, 8, 8), np.float32), name="frames")
        w = tl.from_numpy(np.zeros((4, 2, 3, 3), np.float32), name="kernel")
        with pytest.raises(tl.ShapeError, match=r"frames.*kernel.*3 channels.*expects 2"):
            tl.conv2d(x, w)
        with pytest.raises(tl.ShapeError, match="cast images to float"):
            tl.conv2d(tl.from_numpy(np.zeros((2, 2, 8, 8), np.uint8)), w)


def test_a_weight_gradient_at_every_step_is_vectorised_with_its_steps_kept(backend):
    """``sum_t loss(conv(x[t]))`` with no recurrence: the weight gradients of every step are
    one op that keeps the step axis (``batch``), summed after; equal to torch's."""
    frames = rng.standard_normal((4, 2, 3, 6, 6)).astype(np.float32)
    ctx = tl.Context(dims=("t",))
    (t,), (big_t,) = ctx.dims, ctx.bounds
    with ctx:
        conv = tl.nn.Conv2d(3, 2, 3, padding=1, seed=4)
        y = conv(tl.from_numpy(frames, domain=(t,))[t])
        loss = (y.tanh() * y).sum()
        loss.backward()
        params = conv.parameters()
        outs = [p.grad for p in params]
        got = tl.evaluate(outs + params, bounds={big_t: 4}, backend=backend)
        prog = ctx.compile(outputs=outs, bounds={big_t: 4}, backend="numpy")
    grads = [op for op in prog.ops if op.prim == "conv2d_weight_grad"]
    assert [(op.domain, op.attrs.get("batch"), str(op.shape[0])) for op in grads] == [((), 1, "4")]
    y, ws = _torch_conv(
        torch.tensor(frames.reshape(8, 3, 6, 6), dtype=torch.float64), conv, got[2:]
    )
    want = torch.autograd.grad((y.tanh() * y).sum(), ws)
    for g, w in zip(got[:2], want, strict=True):
        _close(g, w.numpy())


def test_with_weights_loads_arrays_into_a_module_and_checks_their_shapes():
    with tl.Context(dims=("t",)):
        conv = tl.nn.Conv2d(2, 3, 3, seed=1)
        w, b = rng.standard_normal((3, 2, 3, 3)), rng.standard_normal(3)
        loaded = conv.with_weights([w, b])
        x = rng.standard_normal((1, 2, 5, 5)).astype(np.float32)
        (got,) = tl.evaluate([loaded(tl.from_numpy(x))])
        want = F.conv2d(torch.tensor(x, dtype=torch.float64), torch.tensor(w), torch.tensor(b))
        _close(got, want.numpy(), 1e-5)
        with pytest.raises(
            tl.ProgramError, match=r"conv.weight is \(3, 2, 3, 3\), got .*\(3, 2, 2, 2\)"
        ):
            conv.with_weights([w[:, :, :2, :2], b])
        with pytest.raises(tl.ProgramError, match="2 parameters, got 1"):
            conv.with_weights([w])
