"""Storage analysis: block stores for tensors written along a dim and read as slices.

Every program is compared with the unoptimised reference (``optimize=False``: point stores
only) on numpy and torch, and the memory accounting of block stores is checked against the
bytes a plain numpy rollout array takes.
"""

from __future__ import annotations

import re

import numpy as np
import pytest
from core_helpers import until_program

import timerl as tl
from timerl.rl.algos import ppo
from timerl.schedule.program import Compute, Free

BACKENDS = ["numpy", "torch"]


def _rollout(elem: int = 256):
    """A rollout over (i, t) read whole after the loop, through a detach (a view) and a sum."""
    ctx = tl.Context(dims=("i", "t"))
    i, t = ctx.dims
    I, T = ctx.bounds
    with ctx:
        obs = tl.RecurrentTensor.placeholder((elem,), domain=(i, t))
        obs[i, 0] = tl.full((elem,), 1.0) * tl.full((), i)
        obs[i, t + 1] = (obs[i, t] * 0.9).tanh() + 0.1
        batch = obs[i, 0:T].detach()
        loss = batch.sum(0).sum(0) + obs[i, 0:T].mean(0).sum(0)
        first = obs[i, T - 1].sum(0)
        window = obs[i, tl.max(t - 2, 0) : t + 1].sum(0).sum(0)  # read inside the loop: views too
    return ctx, [loss, first, window], obs


def _storage_kinds(prog) -> dict[str, str]:
    return {
        op.label: prog.compiled.storage[op.id].kind
        for op in prog.ops
        if op.id in prog.compiled.storage
    }


def _values(prog, outs, compiled=None):
    prog.run(compiled=compiled)
    return [np.asarray(prog.value(o)) for o in outs]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("compiled", [True, False], ids=["generated", "reference"])
def test_rollout_is_a_block_and_matches_the_reference(backend, compiled):
    ctx, outs, obs = _rollout()
    bounds = {"I": 3, "T": 20}
    ref = ctx.compile(bounds=bounds, outputs=outs, optimize=False, seed=2)
    prog = ctx.compile(bounds=bounds, outputs=outs, backend=backend, seed=2)
    kinds = _storage_kinds(prog)
    assert kinds[obs.name] == "block"
    assert "view" in kinds.values()  # the detach of the whole block
    for a, b in zip(_values(ref, outs), _values(prog, outs, compiled), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-6)
    assert "block" in prog.explain() and f"{obs.name}: block" in prog.explain()


@pytest.mark.parametrize("backend", BACKENDS)
def test_block_memory_is_the_rollout_not_a_copy_more(backend):
    """Peak bytes of the optimised program: one block of the rollout plus small values; the
    point-store reference holds the points and the stacked copies of the slice reads."""
    elem, T = 1024, 200
    ctx, outs, _ = _rollout(elem)
    bounds = {"I": 2, "T": T}
    rollout = T * elem * 4  # float32: one block, as a numpy array of the rollout would be
    ref = ctx.compile(bounds=bounds, outputs=outs, optimize=False, backend=backend)
    ref.run()
    prog = ctx.compile(bounds=bounds, outputs=outs, backend=backend)
    prog.run()
    peak, ref_peak = prog.stats()["peak_bytes"], ref.stats()["peak_bytes"]
    assert rollout <= peak <= 1.1 * rollout, (peak, rollout)
    assert ref_peak > 1.9 * rollout
    # the generated code and the reference account the same bytes
    prog.run(compiled=False)
    assert prog.stats()["peak_bytes"] == peak


def test_no_slice_reader_keeps_point_stores():
    ctx = tl.Context(dims=("t",))
    (t,), (T,) = ctx.dims, ctx.bounds
    with ctx:
        x = tl.RecurrentTensor.placeholder((2,), domain=(t,))
        x[0] = tl.zeros((2,))
        x[t + 1] = x[t] + 1.0
        last = x[T - 1] * 2.0
    prog = ctx.compile(bounds={T: 5}, outputs=[last])
    kinds = _storage_kinds(prog)
    assert "block" not in kinds.values(), kinds
    assert "point (" in prog.explain(full=True)


def test_a_block_outlives_its_views():
    """PPO's update reads views (detach, reshape) of the observation block long after the
    rollout loop: every reader of a view runs before the block is freed."""
    prog = ppo(env_id="CartPole-v1", num_envs=2, num_steps=8, epochs=2, minibatches=2)
    c = prog.ctx.compile(bounds={"I": 2, **prog.bounds}, outputs=list(prog.metrics.values()))
    table = c.compiled.storage
    stmts = c.schedule.statements()
    views = {i: s.base for i, s in table.items() if s.kind == "view"}
    assert views
    for view, base in views.items():
        last_read = max(
            k
            for k, s in enumerate(stmts)
            if isinstance(s, Compute) and any(e.src.id == view for e in s.op.inputs)
        )
        frees = [k for k, s in enumerate(stmts) if isinstance(s, Free) and s.op.id == base]
        assert frees and min(frees) > last_read


def test_a_dynamic_extent_keeps_point_stores_and_says_why():
    ctx, bounds, outs = until_program()
    prog = ctx.compile(bounds=bounds, outputs=outs[1:])
    assert "block" not in _storage_kinds(prog).values()
    assert "known only while it runs" in prog.explain(full=True)


@pytest.mark.parametrize("backend", BACKENDS)
def test_ppo_with_block_stores_matches_the_reference(backend):
    values = []
    for optimize in (False, True):
        prog = ppo(env_id="CartPole-v1", num_envs=2, num_steps=8, epochs=2, minibatches=2)
        metrics = list(prog.metrics.values())
        c = prog.ctx.compile(
            bounds={"I": 2, **prog.bounds}, outputs=metrics, optimize=optimize, backend=backend
        )
        if optimize:
            kinds = _storage_kinds(c)
            assert kinds["obs"] == "block", kinds
        c.run()
        values.append([c.value(m) for m in metrics])
    for a, b in zip(*values, strict=True):
        np.testing.assert_allclose(np.asarray(a, float), np.asarray(b, float), rtol=1e-5, atol=1e-6)


def _held(store) -> int:
    """What a store keeps: its blocks (an alias's are another block's memory) or its points."""
    return len(store.blocks) if hasattr(store, "blocks") else len(store)


@pytest.mark.parametrize("compiled", [True, False], ids=["generated", "reference"])
def test_an_alias_of_a_block_is_freed_with_its_block(compiled):
    """A reshape at each point of a block is the block's rows: its store references the
    block, so it must drop it when the block is freed, or every iteration's block stays."""
    ctx = tl.Context(dims=("i", "t"))
    i, t = ctx.dims
    I, T = ctx.bounds
    with ctx:
        x = tl.RecurrentTensor.placeholder((6,), domain=(i, t))
        x[i, 0] = tl.full((6,), 1.0) * tl.full((), i)
        d = x[i, t].reshape((2, 3))  # on the recurrence: computed in the loop over t
        a = (d * 0.5).tanh()  # read at every t: d is computed at every t
        x[i, t + 1] = a.reshape((6,)) + 0.1
        total = x[i, 0:T].sum(0).sum(0) + a[i, 0:T].sum(0).sum(0)
    bounds = {"I": 4, "T": 6}
    ref = ctx.compile(bounds=bounds, outputs=[total], optimize=False, seed=1)
    prog = ctx.compile(bounds=bounds, outputs=[total], seed=1)
    kinds = _storage_kinds(prog)
    assert kinds[d.name] == "alias" and kinds[x.name] == "block", kinds
    prog.run(compiled=compiled)
    np.testing.assert_allclose(_values(ref, [total])[0], np.asarray(prog.value(total)), rtol=1e-6)
    stores = prog._executor().stores
    assert _held(stores[d.op.id]) == 0
    left = {op.label: _held(stores[op.id]) for op in prog.ops if op.id not in prog.keep}
    assert not any(left.values()), left


@pytest.mark.parametrize("compiled", [True, False], ids=["generated", "reference"])
def test_a_block_read_through_a_view_at_the_first_update_is_freed_there(compiled):
    """The rollout's rows read as an update's starting value (``z[i, 0] = x[i, 0:T]``) are
    dead after the update's first point: the block is freed in that iteration, not after
    the update loop, so it is not counted beside the value that took it over."""
    ctx = tl.Context(dims=("i", "t", "u"))
    i, t, u = ctx.dims
    I, T, U = ctx.bounds
    with ctx:
        x = tl.RecurrentTensor.placeholder((64,), domain=(i, t))
        x[i, 0] = tl.full((64,), 1.0) * tl.full((), i)
        x[i, t + 1] = (x[i, t] * 0.5).tanh() + 0.1
        z = tl.RecurrentTensor.placeholder((T, 64), domain=(i, u))
        z[i, 0] = x[i, 0:T].detach()  # a view of the block, read at u == 0
        z[i, u + 1] = (z[i, u] * 0.9).tanh()
        total = z[i, U - 1].sum(0).sum(0)
    bounds = {"I": 3, "T": 50, "U": 4}
    ref = ctx.compile(bounds=bounds, outputs=[total], optimize=False, seed=1)
    prog = ctx.compile(bounds=bounds, outputs=[total], seed=1)
    assert _storage_kinds(prog)[x.name] == "block"

    def free_depth(body, depth=0):
        for s in body:
            if isinstance(s, Free) and s.op.id == x.op.id:
                yield depth, s
            elif hasattr(s, "body"):
                yield from free_depth(s.body, depth + 1)

    frees = list(free_depth(prog.schedule.body))
    assert frees and all(depth == 2 for depth, _ in frees), frees  # inside i, then u
    planned = prog.planned_peak().peak_bytes
    prog.run(compiled=compiled)
    assert prog.stats()["peak_bytes"] == planned
    np.testing.assert_allclose(_values(ref, [total])[0], np.asarray(prog.value(total)), rtol=1e-6)


def _rows_in_place():
    """Inside the loop over t: ``h`` (a tanh, read whole after the loop: a block), ``c``
    (float plus int, computed in another dtype than one of its inputs: a block written by
    copy) and ``z`` (a product read in a window: a ring)."""
    ctx = tl.Context(dims=("i", "t"))
    i, t = ctx.dims
    I, T = ctx.bounds
    with ctx:
        obs = tl.RecurrentTensor.placeholder((3,), domain=(i, t), name="obs")
        obs[i, 0] = tl.full((3,), 0.5) * tl.full((), i)
        h = (obs[i, t] * 0.5).tanh()
        c = h + tl.full((3,), 1, dtype=np.int64)
        obs[i, t + 1] = c * 0.5 - 0.4
        z = obs[i, t] * 2.0
        loss = h[i, 0:T].sum(0).sum(0) + c[i, 0:T].sum(0).sum(0)
        window = z[i, tl.max(t - 2, 0) : t + 1].sum(0).sum(0)
    return ctx, [loss, window], (h, z, c)


def _writes_rows(source: str, op_id: int) -> bool:
    """A kernel in ``source`` writes its output into a row of block ``op_id`` (read at the
    point, or through the local its entry was read into before the loop, or the views of
    its rows made from that local)."""
    names = [f"BL{op_id}"] + re.findall(rf"(_h\d+) = BL{op_id}\.get\(", source)
    names += [v for e in names[1:] for v in re.findall(rf"(_h\d+) = ROWVIEWS\({e}\)", source)]
    return any(f"out={name}[" in source for name in names)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("compiled", [True, False], ids=["generated", "reference"])
def test_an_elementwise_kernel_writes_its_row_of_the_block(backend, compiled):
    ctx, outs, (h, z, c) = _rows_in_place()
    bounds = {"I": 2, "T": 9}
    ref = ctx.compile(bounds=bounds, outputs=outs, optimize=False)
    prog = ctx.compile(bounds=bounds, outputs=outs, backend=backend)
    storage = {op.label: prog.compiled.storage.get(op.id) for op in prog.ops}
    ids = {op.label: op.id for op in prog.ops}
    assert storage[h.name].kind == "block" and storage[h.name].in_place
    assert storage[z.name].kind == "ring" and storage[z.name].in_place
    assert storage[c.name].kind == "block" and not storage[c.name].in_place
    assert f"{h.name}: block" in prog.explain() and "writes each row in place" in prog.explain()
    for a, b in zip(_values(ref, outs), _values(prog, outs, compiled), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-6)
    ex = prog.executor(compiled=True)
    ex.prepare(hooked=False)
    source = ex.source
    assert _writes_rows(source, ids[h.name]) and _writes_rows(source, ids[z.name])
    assert not _writes_rows(source, ids[c.name])
    # the accounting is the block's, as when the row was copied in
    prog.run(compiled=True)
    peak = prog.stats()["peak_bytes"]
    prog.run(compiled=False)
    assert prog.stats()["peak_bytes"] == peak


@pytest.mark.parametrize("backend", ["numpy", "torch"])
def test_a_transpose_of_a_point_is_a_view_that_keeps_it_alive(backend):
    """``h.T`` read for a product at each point allocates nothing: the meter counts ``h``
    once, and ``h`` lives until the product that reads its transpose."""
    ctx = tl.Context(dims=("t",))
    (t,), (T,) = ctx.dims, ctx.bounds
    rng = np.random.default_rng(0)
    with ctx:
        u = tl.from_numpy(rng.standard_normal((4, 256, 64)).astype(np.float32), domain=(t,))
        h = u.tanh()
        g = (h.T @ h).sum()
    prog = ctx.compile(bounds={T: 4}, outputs=[g], backend=backend)
    views = [op for op in prog.ops if prog.compiled.storage.get(op.id) is not None]
    kinds = {op.prim: prog.compiled.storage[op.id].kind for op in views}
    assert kinds.get("permute") == "view"
    prog.run()
    ref = ctx.compile(bounds={T: 4}, outputs=[g], optimize=False)
    ref.run()
    np.testing.assert_allclose(prog.value(g), ref.value(g), rtol=1e-5)
    # the transpose is not among what holds memory at the peak, and the run's meter agrees
    plan = prog.planned_peak()
    transposes = {op.label for op in prog.ops if op.prim == "permute"}
    assert transposes and not transposes & {name for name, n in plan.holders if n}
    assert prog.stats()["peak_bytes"] == plan.peak_bytes
