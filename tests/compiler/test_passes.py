"""Each compiler pass alone: it keeps values, and it never touches the user's graph."""

from __future__ import annotations

import numpy as np
import pytest
from core_helpers import close, ctx_it, ctx_t

import timerl as tl
from timerl.compiler.cse import merge_duplicates
from timerl.compiler.dce import eliminate_dead_code
from timerl.compiler.guards import add_guards
from timerl.compiler.hoist import hoist_invariants
from timerl.compiler.pipeline import compile as compile_program
from timerl.compiler.simplify import simplify
from timerl.compiler.spec import freeze
from timerl.ir.graph import walk
from timerl.symbolic import TRUE


def _spec(ctx, outputs, bounds):
    ops = [o.op for o in outputs]
    static, dynamic = ctx.resolve_bounds(bounds)
    return freeze([], ops, ctx.dims, ctx._until, static, dynamic)


def _snapshot(ops):
    return [
        (op.id, op.prim, op.domain, op.guard, tuple((e.src.id, e.index, e.cond) for e in op.inputs))
        for op in ops
    ]


def test_freeze_copies_the_graph():
    ctx, t, T = ctx_t()
    with ctx:
        x = tl.RecurrentTensor.placeholder((2,), domain=(t,))
        x[0] = tl.ones((2,))
        x[t + 1] = x * 0.5
    spec = _spec(ctx, [x], {T: 4})
    user_ids = {id(op) for op in walk([x.op])}
    assert not user_ids & {id(op) for op in spec.ops}
    assert {op.id for op in spec.ops} == {op.id for op in walk([x.op])}


def test_passes_leave_the_users_graph_alone():
    ctx, t, T = ctx_t()
    with ctx:
        u = tl.from_numpy(np.arange(5.0), domain=(t,))
        r = tl.RecurrentTensor.placeholder((), domain=(t,))
        r[t.eq(T - 1)] = u
        r[True] = u + 0.9 * r[t + 1]
        a = (u * 1.0).tanh()
        b = (u * 1.0).tanh()  # a duplicate of a
        out = a + b + r
    before = _snapshot(walk([out.op]))
    spec = _spec(ctx, [out], {})
    for p in (eliminate_dead_code, merge_duplicates, simplify, hoist_invariants, add_guards):
        spec = p(spec)
    assert _snapshot(walk([out.op])) == before
    assert all(op.guard == TRUE for op in walk([out.op]))


def test_two_programs_from_one_context_do_not_disturb_each_other():
    ctx, t, T = ctx_t()
    with ctx:
        u = tl.from_numpy(np.linspace(-1, 1, 6), domain=(t,))
        ret = tl.RecurrentTensor.placeholder((), domain=(t,))
        ret[t.eq(T - 1)] = u
        ret[True] = u + 0.5 * ret[t + 1]
        twice = (u * 2.0).tanh() + (u * 2.0).tanh()
    first = ctx.compile(outputs=[ret, twice])
    second = ctx.compile(outputs=[ret], optimize=False)
    third = ctx.compile(outputs=[twice])
    want_ret = [sum(0.5**k * v for k, v in enumerate(np.linspace(-1, 1, 6)[s:])) for s in range(6)]
    for prog in (first, second, third, first):
        prog.run()
    close(first.value(ret), want_ret)
    close(second.value(ret), want_ret)
    close(third.value(twice), 2 * np.tanh(2 * np.linspace(-1, 1, 6)))
    close(first.value(twice), 2 * np.tanh(2 * np.linspace(-1, 1, 6)))


def test_simplify_folds_constants_and_removes_identities():
    ctx, t, T = ctx_t()
    with ctx:
        u = tl.from_numpy(np.arange(4.0), domain=(t,))
        c = tl.full((3,), 2.0) * 3.0 + 1.0  # constant: folded
        y = -(-(u * 1.0 + 0.0))  # identities  # noqa: B002
        out = y + c.sum()
    spec = _spec(ctx, [out], {})
    simple = simplify(eliminate_dead_code(spec))
    prims_left = sorted(op.prim for op in simple.ops)
    assert "neg" not in prims_left and "mul" not in prims_left
    assert len(simple.ops) < len(eliminate_dead_code(spec).ops)
    close(tl.evaluate(out), np.arange(4.0) + 21.0)
    close(tl.evaluate(out, optimize=False), np.arange(4.0) + 21.0)


def test_simplify_removes_a_gradient_with_one_contribution():
    """Autodiff sums each gradient's contributions with add_n; with one it is its input."""
    ctx, t, T = ctx_t()
    with ctx:
        w = tl.from_numpy(np.linspace(-1, 1, 4), requires_grad=True)
        loss = ((w * 2.0).tanh() * 3.0).sum()
        loss.backward()
        out = w.grad * 1.5
    spec = _spec(ctx, [out], {})
    given = eliminate_dead_code(spec)
    single = [op for op in given.ops if op.prim == "add_n" and len(op.inputs) == 1]
    assert single
    simple = simplify(given)
    assert not [op for op in simple.ops if op.prim == "add_n" and len(op.inputs) == 1]
    want = tl.evaluate(out, optimize=False)
    close(tl.evaluate(out), want)


def test_simplify_removes_a_detach_once_gradients_are_built():
    """A compiled program differentiates nothing more: a detach is its input (counted once,
    as the same array is), and the values and gradients stay the reference's."""
    ctx, t, T = ctx_t()
    with ctx:
        w = tl.from_numpy(np.linspace(-1, 1, 4), requires_grad=True)
        g = (w * 2.0).tanh()
        loss = (g * g.detach()).sum()
        loss.backward()
        out = w.grad.detach() * 1.5
    spec = _spec(ctx, [out, loss], {})
    given = eliminate_dead_code(spec)
    assert [op for op in given.ops if op.prim == "detach"]
    simple = simplify(given)
    assert not [op for op in simple.ops if op.prim == "detach"]
    for a, b in zip(
        tl.evaluate([out, loss]), tl.evaluate([out, loss], optimize=False), strict=True
    ):
        close(a, b)
    x = np.tanh(2 * np.linspace(-1, 1, 4))
    close(tl.evaluate(out), 1.5 * x * 2 * (1 - x**2))


def test_simplify_keeps_a_broadcasting_identity():
    # x * ones((3,)) changes x's shape: not an identity
    ctx, t, T = ctx_t()
    with ctx:
        u = tl.from_numpy(np.arange(4.0), domain=(t,))
        out = u * tl.ones((3,))
    close(tl.evaluate(out), np.repeat(np.arange(4.0)[:, None], 3, axis=1))


def test_hoist_drops_a_dim_no_input_uses():
    ctx, i, t, I, T = ctx_it()
    with ctx:
        x = tl.from_numpy(np.ones((2, 3)), domain=(i, t))
        out = x + tl.full((), 0.5).exp() * x
    prog = ctx.compile(outputs=[out])
    prog.run()
    close(prog.value(out), np.full((2, 3), 1 + np.exp(0.5)))


@pytest.mark.parametrize("optimize", [True, False])
def test_optimize_flag_gives_the_same_values(optimize):
    ctx, t, T = ctx_t()
    with ctx:
        x = tl.RecurrentTensor.placeholder((2,), domain=(t,))
        x[0] = tl.ones((2,))
        x[t + 1] = x * 0.5 + tl.full((2,), 1.0) * 1.0
    want = [np.ones(2)]
    for _ in range(4):
        want.append(want[-1] * 0.5 + 1.0)
    close(tl.evaluate(x, bounds={T: 5}, optimize=optimize), np.stack(want))


def test_compile_reports_every_pass():
    ctx, t, T = ctx_t()
    with ctx:
        x = tl.from_numpy(np.arange(3.0), domain=(t,))
        out = x * 1.0
    spec = _spec(ctx, [out], {})
    report = compile_program(spec).report
    names = [n for n, _ in report.timings]
    for name in ("dead code", "duplicate code", "simplification", "loop-invariant hoisting"):
        assert name in names
    # fusion last: it groups the final schedule's statements (compiler/fusion.py)
    assert names[-4:] == ["memory statements", "storage", "donation", "fusion"]
    unoptimised = [
        n for n, _ in compile_program(spec, tl.CompileOptions(optimize=False)).report.timings
    ]
    assert "simplification" not in unoptimised and "validation" in unoptimised
    # the reference keeps point stores
    assert unoptimised[-2:] == ["memory statements", "fusion"]


def test_gradient_seed_is_hoisted_and_folded():
    # a loss per point (i, t): the seed of its gradient, and what is built from it alone, is the
    # same at every point
    ctx, i, t, I, T = ctx_it()
    x0 = np.linspace(-1, 1, 6).reshape(2, 3)
    with ctx:
        x = tl.from_numpy(x0, domain=(i, t), requires_grad=True)
        loss = (x * x * 3.0).sum()
        loss.backward()
    spec = eliminate_dead_code(_spec(ctx, [x.grad], {}))
    hoisted = hoist_invariants(spec)
    before = {op.id: op.domain for op in spec.ops}
    moved = [op for op in hoisted.ops if op.domain != before[op.id]]
    assert moved and all(op.domain == () for op in moved)
    folded = simplify(hoisted)
    assert len(folded.ops) < len(hoisted.ops)
    close(tl.evaluate(x.grad), 6 * x0)
    close(tl.evaluate(x.grad, optimize=False), 6 * x0)


@pytest.mark.parametrize("enabled_before", [True, False])
def test_the_cyclic_collector_is_paused_while_compiling_and_restored(monkeypatch, enabled_before):
    import gc

    from timerl.api import context

    seen = []
    real = context.compile_program

    def observing(*args, **kwargs):
        seen.append(gc.isenabled())
        return real(*args, **kwargs)

    monkeypatch.setattr(context, "compile_program", observing)
    ctx, t, T = ctx_t()
    with ctx:
        x = tl.RecurrentTensor.placeholder((), domain=(t,))
        x[0] = 1.0
        x[t + 1] = x[t] * 0.5
    was = gc.isenabled()
    try:
        (gc.enable if enabled_before else gc.disable)()
        prog = ctx.compile({T: 4}, outputs=[x])
        assert seen == [False]
        assert gc.isenabled() is enabled_before
    finally:
        (gc.enable if was else gc.disable)()
    close(prog.run().value(x), [1.0, 0.5, 0.25, 0.125])
