"""Incrementalisation (compiler/incrementalize.py): computations over many rows run by blocks.

Every blocked program is compared value for value with the unoptimised reference
(``optimize=False``), on numpy and torch.
"""

from __future__ import annotations

import numpy as np
import pytest

import timerl as tl
from timerl.compiler.incrementalize import (
    Decline,
    block_rows,
    find_region,
    row_rule,
)
from timerl.ir.graph import Op
from timerl.schedule.program import Compute, Loop
from timerl.symbolic import Const

BACKENDS = ["numpy", "torch"]


def _regression(rows: int = 4096, width: int = 32, hidden: int = 64, extra=None):
    """Three Adam steps of a tanh MLP fitted to ``rows`` rows: the loss and its gradient
    are sums over the rows."""
    rng = np.random.default_rng(0)
    x_np = rng.standard_normal((rows, width)).astype(np.float32)
    y_np = rng.standard_normal((rows, 1)).astype(np.float32)
    ctx = tl.Context(dims=("i",))
    (i,), (I,) = ctx.dims, ctx.bounds
    with ctx:
        x, y = tl.from_numpy(x_np), tl.from_numpy(y_np)
        mlp = tl.nn.MLP([width, hidden, hidden, 1], activation="tanh", seed=1, domain=(i,))
        pred = mlp(x)
        loss = ((pred - y) ** 2).mean()
        if extra is not None:
            loss = loss + extra(pred)
        loss.backward()
        tl.optim.Adam(mlp.parameters(), lr=1e-2).step()
    return ctx, {I: 3}, [loss, *mlp.parameters()]


def _blocks(count: int) -> tl.CompileOptions:
    return tl.CompileOptions(blocks=count)


def _compare(ctx, bounds, outs, backend: str, **kw):
    prog = ctx.compile(bounds=bounds, backend=backend, outputs=outs, **kw)
    prog.run()
    ref = ctx.compile(bounds=bounds, outputs=outs, optimize=False)
    ref.run()
    # the sums run in another order: float32 rounding, which Adam's first steps (a
    # gradient over its own square root) carry into the weights at about 1e-6
    for o in outs:
        np.testing.assert_allclose(prog.value(o), ref.value(o), rtol=1e-4, atol=1e-5)
    return prog


def _loops_over_blocks(body, found=None) -> list[Loop]:
    found = [] if found is None else found
    for s in body:
        if isinstance(s, Loop):
            if s.dim.name.startswith("blocks"):
                found.append(s)
            _loops_over_blocks(s.body, found)
    return found


@pytest.mark.parametrize("backend", [*BACKENDS, "jax"])
def test_a_training_step_over_many_rows_runs_by_blocks_and_equals_the_reference(backend):
    if backend == "jax":
        pytest.importorskip("jax")
    ctx, bounds, outs = _regression()
    prog = _compare(ctx, bounds, outs, backend, options=_blocks(4))
    text = prog.explain()
    assert "incrementalised" in text and "1,024 rows at a time" in text and "(4 blocks)" in text
    loops = _loops_over_blocks(prog.schedule.body)
    assert len(loops) == 1  # forward, backward and the sums in one pass over the blocks
    # the block reads of outside values are computed inside that loop, not held before it
    reads = [
        s for s in prog.schedule.statements() if isinstance(s, Compute) and "[rows of" in s.op.label
    ]
    assert reads and all(any(s is b for b in loops[0].body) for s in reads)


@pytest.mark.parametrize("backend", BACKENDS)
def test_blocks_hold_less_than_the_whole_range(backend):
    ctx, bounds, outs = _regression(rows=2048, hidden=128)
    whole = ctx.compile(bounds=bounds, backend=backend, outputs=outs).planned_peak()
    blocked = ctx.compile(bounds=bounds, backend=backend, outputs=outs, options=_blocks(8))
    # the activations (2048 x 128 floats, 1 MiB each) are held 256 rows at a time
    assert blocked.planned_peak().peak_bytes < whole.peak_bytes / 2
    blocked.run()
    assert blocked.stats()["peak_bytes"] <= blocked.planned_peak().peak_bytes


def test_a_value_also_read_whole_keeps_its_blocks():
    """``pred`` is also read by a cumulative sum over the rows (which mixes them): its blocks
    are kept and read as one array after the loop; the rest still runs by blocks."""
    ctx, bounds, outs = _regression(extra=lambda p: p.cumsum(0).sum() * 1e-3)
    prog = _compare(ctx, bounds, outs, "numpy", options=_blocks(4))
    assert any("[all blocks]" in op.label for op in prog.ops)


def test_a_budget_the_whole_range_exceeds_is_met_by_blocks():
    ctx, bounds, outs = _regression(rows=4096, hidden=128)
    whole = ctx.compile(bounds=bounds, outputs=outs).planned_peak().peak_bytes
    budget = whole // 3
    prog = _compare(ctx, bounds, outs, "numpy", memory_budget=budget)
    assert prog.planned_peak().peak_bytes <= budget
    assert "run in blocks" in prog.explain()
    with pytest.raises(tl.MemoryBudgetError):
        ctx.compile(bounds=bounds, outputs=outs, memory_budget=whole // 100)


def test_no_region_below_two_blocks_or_without_rows():
    ctx, bounds, outs = _regression()
    prog = ctx.compile(bounds=bounds, outputs=outs, options=_blocks(1))
    assert "incrementalised" not in prog.explain()
    ctx, bounds, outs = _regression(rows=512)  # 128 KiB activations: not worth a loop
    assert (
        "incrementalised"
        not in ctx.compile(bounds=bounds, outputs=outs, options=_blocks(4)).explain()
    )


def test_a_wide_outside_input_is_multiplied_whole():
    """A first layer over rows 8x wider than its output reads them whole (by chunks when
    streamed); the layers after it run by blocks."""
    ctx, bounds, outs = _regression(width=512, hidden=64)
    prog = ctx.compile(bounds=bounds, outputs=outs)
    spec = prog.compiled.spec
    domains = {op.domain for op in spec.ops}
    regions = [r for r in (find_region(spec, d, 8) for d in domains) if r is not None]
    assert regions
    by_id = {op.id: op for op in spec.ops}
    products = [by_id[i] for r in regions for i in r.axis if by_id[i].prim == "matmul"]
    assert products
    assert all(op.inputs[0].src.shape[-1] != Const(512) for op in products)


# --- the rules, one by one --------------------------------------------------------------------


def test_block_rows_divides_the_rows():
    assert block_rows(8000, 8) == 1000
    assert block_rows(12, 5) == 2
    assert block_rows(7, 2) == 1  # a prime: no block but single rows
    assert block_rows(250, 16) == 10


def _op(prim: str, out, **attrs) -> Op:
    return Op(prim, (), tuple(Const(s) for s in out), np.dtype("float32"), attrs=attrs)


def _s(*shape):
    return tuple(Const(s) for s in shape)


def test_row_rules_follow_the_rows_through_each_primitive():
    add = _op("add", (8, 4))
    assert row_rule("add")(add, 0, _s(8, 4), [_s(8, 4), _s(4)]) == (0, None)
    assert row_rule("add")(add, 0, _s(8, 4), [_s(8, 4), _s(1, 4)]) == (0, None)
    mm = _op("matmul", (8, 3))
    assert row_rule("matmul")(mm, 0, _s(8, 3), [_s(8, 4), _s(4, 3)]) == (0, None)
    assert row_rule("matmul")(mm, 1, _s(3, 8), [_s(3, 4), _s(4, 8)]) == (None, 1)
    rs = _op("reshape", (8, 1), shape=_s(8, 1))
    assert row_rule("reshape")(rs, 0, _s(8, 1), [_s(8)]) == (0,)
    flat = _op("reshape", (32,), shape=_s(32))
    with pytest.raises(Decline):
        row_rule("reshape")(flat, 0, _s(32), [_s(8, 4)])
    perm = _op("permute", (4, 8), perm=(1, 0))
    assert row_rule("permute")(perm, 1, _s(4, 8), [_s(8, 4)]) == (0,)
    total = _op("sum", (8,), axes=(1,), keepdims=False)
    assert row_rule("sum")(total, 0, _s(8), [_s(8, 4)]) == (0,)
    across = _op("sum", (1, 8), axes=(0,), keepdims=True)
    with pytest.raises(Decline):  # summing over the rows is an accumulation, not a row op
        row_rule("sum")(across, 0, _s(1, 8), [_s(4, 8)])
    assert row_rule("cumsum") is None and row_rule("normal") is None


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_categorical_likelihood_runs_by_blocks(backend):
    """A classifier's log-likelihood picks each row's label (``gather``, along the other
    axis): it runs by blocks, in one loop with the rest (its gradient's ``scatter_add`` is
    a constant here, folded before the loop)."""
    rng = np.random.default_rng(1)
    labels = rng.integers(0, 4, size=(4096, 1))

    ctx = tl.Context(dims=("i",))
    (i,), (I,) = ctx.dims, ctx.bounds
    with ctx:
        x = tl.from_numpy(rng.standard_normal((4096, 16)).astype(np.float32))
        y = tl.from_numpy(labels)
        mlp = tl.nn.MLP([16, 64, 4], activation="tanh", seed=2, domain=(i,))
        logp = mlp(x).log_softmax(-1).gather(1, y)
        loss = -logp.mean()
        loss.backward()
        tl.optim.Adam(mlp.parameters(), lr=1e-2).step()
    outs = [loss, *mlp.parameters()]
    prog = _compare(ctx, {I: 3}, outs, backend, options=_blocks(4))
    assert len(_loops_over_blocks(prog.schedule.body)) == 1
    assert "gather" in {op.prim for op in prog.ops if len(op.domain) == 2}


def test_gather_and_scatter_add_follow_the_rows_along_another_axis():
    pick = _op("gather", (8, 1), axis=1)
    assert row_rule("gather")(pick, 0, _s(8, 1), [_s(8, 4), _s(8, 1)]) == (0, 0)
    put = _op("scatter_add", (8, 4), axis=1, shape=_s(8, 4))
    assert row_rule("scatter_add")(put, 0, _s(8, 4), [_s(8, 1), _s(8, 1)]) == (0, 0)
    with pytest.raises(Decline):
        row_rule("gather")(_op("gather", (2, 4), axis=0), 0, _s(2, 4), [_s(8, 4), _s(2, 4)])


@pytest.mark.parametrize("value", ["four", 0, -2, 1.5, True])
def test_a_block_count_that_is_not_a_positive_whole_number_is_refused_by_name(value):
    with pytest.raises(tl.ProgramError, match=rf"CompileOptions\(blocks={value!r}\)"):
        tl.CompileOptions(blocks=value)


def _cnn_step(rows: int = 2048):
    """An Adam step of a small convolutional regressor over ``rows`` frames (uint8)."""
    rng = np.random.default_rng(3)
    frames = rng.integers(0, 256, (rows, 2, 12, 12), dtype=np.uint8)
    target = rng.standard_normal((rows, 1)).astype(np.float32)
    ctx = tl.Context(dims=("i",))
    (i,), (I,) = ctx.dims, ctx.bounds
    with ctx:
        conv = tl.nn.Conv2d(2, 8, 3, stride=2, padding=1, seed=1, domain=(i,))
        head = tl.nn.Linear(8 * 6 * 6, 1, seed=2, domain=(i,))
        x = tl.from_numpy(frames).float() * (1.0 / 255.0)
        pred = head(tl.nn.Flatten()(tl.max_pool2d(conv(x).relu(), 3, 1, 1)))
        loss = ((pred - tl.from_numpy(target)) ** 2).mean()
        loss.backward()
        params = conv.parameters() + head.parameters()
        tl.optim.Adam(params, lr=1e-2).step()
    return ctx, {I: 2}, [loss, *params]


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_convolution_over_many_frames_runs_by_blocks(backend):
    """The conv, its pooling and their gradients follow the frames' rows; the weights'
    gradient is the sum of its blocks' gradients."""
    ctx, bounds, outs = _cnn_step()
    prog = _compare(ctx, bounds, outs, backend, options=_blocks(4))
    assert "incrementalised" in prog.explain()
    blocked = {op.prim for op in prog.ops if len(op.domain) == 2}
    assert {"conv2d", "max_pool2d", "max_pool2d_grad", "conv2d_weight_grad"} <= blocked


def test_conv_row_rules_follow_the_images_rows():
    conv = _op("conv2d", (8, 4, 5, 5), stride=(1, 1), padding=(0, 0))
    rule = row_rule("conv2d")
    assert rule(conv, 0, _s(8, 4, 5, 5), [_s(8, 3, 7, 7), _s(4, 3, 3, 3)]) == (0, None)
    with pytest.raises(Decline):  # a spatial axis: neighbouring rows mix under the kernel
        rule(conv, 2, _s(8, 4, 5, 5), [_s(8, 3, 7, 7), _s(4, 3, 3, 3)])
    grad = _op("max_pool2d_grad", (8, 3, 6, 6), kernel=(2, 2), stride=(2, 2), padding=(0, 0))
    assert row_rule("max_pool2d_grad")(
        grad, 0, _s(8, 3, 6, 6), [_s(8, 3, 6, 6), _s(8, 3, 3, 3)]
    ) == (0, 0)
