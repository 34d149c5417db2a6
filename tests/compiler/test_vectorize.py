"""Vectorisation: batched ops give the unoptimised reference's values, and decline what they must."""

from __future__ import annotations

import numpy as np
import pytest
from core_helpers import BACKENDS, against_reference, close, ctx_it, ctx_t

import timerl as tl
from timerl.api.tensor import RecurrentTensor
from timerl.compiler import vectorize as vec
from timerl.compiler.pipeline import compile as compile_program
from timerl.compiler.spec import freeze
from timerl.ir import rowwise
from timerl.ir.build import apply
from timerl.ir.graph import walk


def _rand(*shape, seed=0):
    return np.random.RandomState(seed).randn(*shape).astype(np.float32)


def _both(outputs, bounds, backend):
    """Values with every optimisation against the reference's; the optimised program."""
    return against_reference(outputs, bounds, backend)


def _notes(prog, kind="vectorised"):
    return [n for n in prog.report.notes if n.startswith(kind + " ")]


def _vectorised(prog, name):
    return any(n.startswith(f"vectorised {name} over") for n in prog.report.notes)


def _reason(prog, name):
    for n in prog.report.notes:
        if n.startswith(f"not vectorised {name} over"):
            return n.split(": ", 1)[1]
    raise AssertionError(f"no note for {name}: {prog.report.notes}")


def _domains(prog):
    return {op.name: op.domain for op in prog.compiled.spec.ops if op.name}


# --- chains and readers --------------------------------------------------------------------------


@pytest.mark.parametrize("backend", BACKENDS)
def test_chain_over_t_runs_once_per_iteration(backend):
    ctx, i, t, big_i, big_t = ctx_it()
    with ctx:
        w = tl.from_numpy(_rand(3, 4, seed=1))
        x = tl.from_numpy(_rand(2, 5, 2, 3, seed=2), domain=(i, t))
        h = (x @ w).tanh().named("h")
        y = (h * 2.0 + 1.0).named("y")
        total = y[i, 0:big_t].sum().named("total")
        last = (y[i, big_t - 1] * 3.0).named("last")
    prog = _both([total, last], {}, backend)
    assert _vectorised(prog, "h") and _vectorised(prog, "y")
    dom = _domains(prog)
    assert dom["h"] == (i,) and dom["y"] == (i,)  # computed once per i, not per (i, t)
    assert "vectorised h over t" in prog.explain()


@pytest.mark.parametrize("backend", BACKENDS)
def test_recurrence_stays_in_its_loop_and_its_readers_are_batched(backend):
    ctx, i, t, big_i, big_t = ctx_it()
    with ctx:
        u = tl.from_numpy(_rand(2, 6, 3, seed=3), domain=(i, t))
        w = tl.from_numpy(_rand(3, 3, seed=4) * 0.5)
        h = RecurrentTensor.placeholder((1, 3), domain=(i, t), name="state")
        h[i, 0] = tl.zeros((1, 3))
        h[i, t + 1] = (h @ w + u[i, t + 1].reshape(1, 3)).tanh()
        out = (h * h).named("sq")
        total = out[i, 0:big_t].sum(0)
    prog = _both([total], {}, backend)
    assert "recurrence over t" in _reason(prog, "state")
    assert _vectorised(prog, "sq")


def test_outermost_dim_batches_only_whole_chains():
    # gathering a value the outer loop computes would split that loop (hooks need one)
    ctx, t, big_t = ctx_t()
    with ctx:
        h = RecurrentTensor.placeholder((), domain=(t,), name="state")
        h[0] = 1.0
        h[t + 1] = h * 0.5
        sq = (h * h).named("sq")
        u = tl.from_numpy(_rand(5, seed=20), domain=(t,))
        v = (u * 2.0).named("v")
        total = sq[0:big_t].sum(0) + v[0:big_t].sum(0)
    prog = _both([total], {}, "numpy")
    assert "outermost dim" in _reason(prog, "sq")
    assert _vectorised(prog, "v")
    assert prog.executor().outer_loop().dim is t  # still one loop over t


def _critic(i, t, seed):
    """Observations over (i, t) and a linear critic's value of each (in the current context)."""
    obs = tl.from_numpy(_rand(2, 7, 4, seed=seed), domain=(i, t))
    w = tl.from_numpy(_rand(4, 1, seed=seed + 1))
    return obs, (obs.reshape(1, 4) @ w).reshape(()).named("value")


@pytest.mark.parametrize("backend", BACKENDS)
def test_point_reader_inside_a_later_loop_reads_a_view(backend):
    # the critic-in-GAE pattern: value is read at t + 1 by a backward recurrence's input
    ctx, i, t, big_i, big_t = ctx_it()
    with ctx:
        _obs, value = _critic(i, t, seed=5)
        nxt = RecurrentTensor.placeholder((), domain=(i, t), name="next_value")
        nxt[t.eq(big_t - 1)] = value * 0.0
        nxt[True] = value[i, t + 1]
        ret = RecurrentTensor.placeholder((), domain=(i, t), name="ret")
        ret[t.eq(big_t - 1)] = nxt
        ret[True] = value + 0.9 * nxt + 0.5 * ret[i, t + 1]
        total = ret[i, 0:big_t].sum()
    prog = _both([total], {}, backend)
    assert _vectorised(prog, "value")
    assert "recurrence" in _reason(prog, "ret")


@pytest.mark.parametrize("backend", BACKENDS)
def test_gradients_flow_through_vectorised_ops(backend):
    ctx, i, t, big_i, big_t = ctx_it()
    with ctx:
        w = tl.from_numpy(_rand(3, 2, seed=7), requires_grad=True)
        x = tl.from_numpy(_rand(2, 6, 4, 3, seed=8), domain=(i, t))
        h = (x @ w).tanh().named("h")
        logits = h - h.max(-1, keepdim=True)
        lp = (logits - logits.exp().sum(-1, keepdim=True).log()).named("logp")
        loss = lp[i, 0:big_t].mean()
        loss.backward(inputs=[w])
        grad = w.grad
    prog = _both([loss, grad], {}, backend)
    assert _vectorised(prog, "h") and _vectorised(prog, "logp")
    # the backward pass over t is batched too
    # (a gradient with one contribution is its input after simplification: the sums of two
    # and the backward matmul are what is left to batch)
    assert sum(" grad(" in n for n in _notes(prog)) >= 2
    assert sum(n.endswith("(matmul)") for n in _notes(prog)) >= 2


def test_vectorising_leaves_the_input_spec_alone():
    ctx, i, t, big_i, big_t = ctx_it()
    with ctx:
        x = tl.from_numpy(_rand(2, 4, 3, seed=9), domain=(i, t))
        y = (x * 2.0).exp()
        total = y[i, 0:big_t].sum()
    static, dynamic = ctx.resolve_bounds({})
    spec = freeze([], [total.op], ctx.dims, ctx._until, static, dynamic)
    before = [(op.id, op.prim, op.domain, tuple(e.index for e in op.inputs)) for op in spec.ops]
    out = vec.vectorize(spec)
    assert out is not spec
    after = [(op.id, op.prim, op.domain, tuple(e.index for e in op.inputs)) for op in spec.ops]
    assert before == after
    assert {op.id for op in walk([total.op])} <= {op.id for op in spec.ops}


# --- batching rules, each against the reference --------------------------------------------------

RULE_CASES = {
    "sum_negative_axis": lambda x: x.sum(-1),
    "sum_axis_keepdim": lambda x: x.sum(0, keepdim=True),
    "sum_all": lambda x: x.sum(),
    "max": lambda x: x.max(1),
    "argmax": lambda x: x.argmax(1).float(),
    "cumsum": lambda x: x.cumsum(1),
    "argsort": lambda x: x.argsort(0).float(),
    "reshape": lambda x: x.reshape(6),
    "permute": lambda x: x.permute(1, 0),
    "expand": lambda x: x.sum(0, keepdim=True).expand(4, 3),
    "getitem": lambda x: x[(*x.domain, slice(1, None), slice(None, None, 2))],
    "getitem_int": lambda x: x[(*x.domain, Ellipsis, 2)],
    "narrow": lambda x: x.narrow(1, 1, 2),
    "cast": lambda x: (x > 0.0).float(),
    "where": lambda x: tl.where(x > 0.0, x, x * 0.1),
    "matmul_right": lambda x: tl.from_numpy(_rand(4, 2, seed=11)) @ x,
    "matmul_left": lambda x: x.permute(1, 0) @ tl.from_numpy(_rand(2, 5, seed=12)),
    "scalar_times_vector": lambda x: x.sum() * tl.from_numpy(_rand(3, seed=13)),
    "cat": lambda x: tl.cat([x, x * 2.0], 0),
    "gather": lambda x: x.gather(1, (x > 0.0).long()),
    "take": lambda x: x.take(tl.from_numpy(np.array([1, 0, 1])), 0),
}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("case", sorted(RULE_CASES))
def test_batching_rule_matches_reference(case, backend):
    ctx, i, t, big_i, big_t = ctx_it()
    with ctx:
        x = tl.from_numpy(_rand(2, 5, 2, 3, seed=10), domain=(i, t))
        y = RULE_CASES[case](x).named("y")
        z = (y * 1.5).named("z")
        out = z[i, 0:big_t]
    prog = _both([out], {}, backend)
    assert _vectorised(prog, "y"), prog.report.notes
    assert _vectorised(prog, "z")


# --- what is declined ----------------------------------------------------------------------------


def test_dynamic_bound_is_declined_and_values_hold():
    ctx, t, big_t = ctx_t()
    with ctx:
        x = RecurrentTensor.placeholder((), dtype="float64", domain=(t,), name="x")
        x[0] = 1.0
        x[t + 1] = x * 1.5
        ctx.until(t, x > 10.0)
        y = (x * 2.0).exp().named("y")
        total = y[0:big_t].sum(0)
    prog = _both([total], {big_t: 100}, "numpy")
    assert "ctx.until" in _reason(prog, "y")


def test_user_function_is_never_vectorised():
    ctx, i, t, big_i, big_t = ctx_it()
    with ctx:
        x = tl.from_numpy(_rand(2, 4, 3, seed=14), domain=(i, t))
        view = apply("udf", x.view, fn=lambda a: a * 2.0, shape=(3,), dtype=np.dtype("float32"))
        view.op.name = "twice"
        y = RecurrentTensor(view, ctx)
        total = (y + 1.0)[i, 0:big_t].sum()
    prog = _both([total], {}, "numpy")
    assert _reason(prog, "twice") == "it is a user function"


def test_random_is_batched_and_effects_read_views():
    """A random op draws from a key that is a pure function of its point, so one batched draw
    over t equals the T draws point by point; a sink still sees every point, in order."""
    ctx, i, t, big_i, big_t = ctx_it()
    with ctx:
        x = tl.from_numpy(_rand(2, 3, 3, seed=21), domain=(i, t))
        noise = tl.rand((3,), like=x).named("noise")
        y = (noise * x).named("y")
        seen = []
        tl.sink(y, lambda value, point: seen.append((point["i"], point["t"], value.sum())))
        total = y[i, 0:big_t].sum()
    prog = _both([total], {}, "numpy")
    assert _vectorised(prog, "noise")
    assert _vectorised(prog, "y")  # the sink reads a view of its batch, point by point
    seen.clear()
    prog.run()
    want = tl.evaluate([y], optimize=False)[0].sum(-1)
    assert [(p, q) for p, q, _ in seen] == [(p, q) for p in range(2) for q in range(3)]
    close([v for _, _, v in seen], want.reshape(-1))


@pytest.mark.parametrize("backend", BACKENDS)
def test_batched_draws_equal_point_draws_for_shifted_and_shared_keys(backend):
    """Keys that move with t by an offset or a factor, or not at all, batch exactly; a key
    that is not affine in t stays in the loop; along the outermost dim nothing is batched."""
    ctx, i, t, big_i, big_t = ctx_it()
    with ctx:
        x = tl.from_numpy(_rand(2, 4, 2, seed=3), domain=(i, t))
        shifted = tl.randn((2,), like=x, key_at=(i, t * 2 + 1)).named("shifted")
        shared = tl.randn((2,), like=x, key_at=(i,)).named("shared")
        clamped = tl.rand((2,), like=x, key_at=(tl.min(t, 2),)).named("clamped")
        y = (x * shifted + shared * clamped).named("y")
        total = y[i, 0:big_t].sum()
    prog = _both([y, total], {}, backend)
    assert _vectorised(prog, "shifted") and _vectorised(prog, "shared")
    assert "not affine" in _reason(prog, "clamped")
    values = tl.evaluate([shifted, shared], optimize=False)
    assert not np.allclose(values[0][0, 0], values[0][0, 1])  # fresh numbers per point
    np.testing.assert_array_equal(values[1][0, 0], values[1][0, 3])  # one key, one draw


def test_random_over_the_outermost_dim_stays_in_its_loop():
    ctx, i, t, big_i, big_t = ctx_it()
    with ctx:
        w = tl.from_numpy(_rand(3, 2, seed=4), domain=(i,))
        noise = tl.randn((2,), like=w).named("noise")
        total = (w * noise).named("wn")
    prog = _both([total], {}, "numpy")
    assert "outermost dim" in _reason(prog, "noise")


def test_cost_cap_declines_large_batches(monkeypatch):
    monkeypatch.setattr(vec, "MAX_BATCH_BYTES", 16)
    ctx, i, t, big_i, big_t = ctx_it()
    with ctx:
        x = tl.from_numpy(_rand(2, 5, 3, seed=15), domain=(i, t))
        y = (x * 2.0).named("y")
        total = y[i, 0:big_t].sum()
    prog = _both([total], {}, "numpy")
    assert "exceeds 16 bytes" in _reason(prog, "y")


@pytest.mark.parametrize("backend", BACKENDS)
def test_inputs_defined_only_where_needed_are_not_gathered(backend):
    # the branch's input reads u[t + 1]: it exists only for t < T - 1, so batching the
    # branch (which would read it over the whole range) is declined
    ctx, i, t, big_i, big_t = ctx_it()
    with ctx:
        u = tl.from_numpy(_rand(2, 5, 3, seed=22), domain=(i, t))
        ahead = (u[i, t + 1] * 2.0).named("ahead")
        branch = (ahead + 1.0).named("branch")
        z = RecurrentTensor.placeholder((3,), domain=(i, t), name="z")
        z[t.eq(big_t - 1)] = tl.zeros((3,))
        z[True] = branch
        total = (z * 3.0)[i, 0:big_t].sum()
    prog = _both([total], {}, backend)
    assert "not defined at every point" in _reason(prog, "branch")


# --- piecewise definitions ----------------------------------------------------------------------


def _batched_op(prog, name):
    return next(op for op in prog.compiled.spec.ops if op.name == name)


@pytest.mark.parametrize("backend", BACKENDS)
def test_piecewise_definition_batches_as_runs_of_its_branches(backend):
    # GAE's next value: the critic one step ahead, the bootstrap value at the last step
    ctx, i, t, big_i, big_t = ctx_it()
    with ctx:
        obs, value = _critic(i, t, seed=30)
        last = (obs[i, big_t - 1].sum() * 0.5).named("last")
        nxt = RecurrentTensor.placeholder((), domain=(i, t), name="next_value")
        nxt[t.eq(big_t - 1)] = last
        nxt[True] = value[i, t + 1]
        total = (nxt * 2.0 - value)[i, 0:big_t].sum()
    prog = _both([total], {}, backend)
    assert _vectorised(prog, "next_value")
    op = _batched_op(prog, "next_value")
    assert op.prim == "cat" and op.domain == (i,)
    # one run reads the batched critic from its second point on, the other broadcasts
    assert sorted(e.src.prim for e in op.inputs) == ["expand", "narrow"]


@pytest.mark.parametrize("backend", BACKENDS)
def test_three_runs_read_slices_of_a_recurrence(backend):
    # the middle run reads a recurrence (not batched) one step back: a slice of its points
    ctx, i, t, big_i, big_t = ctx_it()
    with ctx:
        x = tl.from_numpy(_rand(2, 6, 3, seed=32), domain=(i, t))
        h = RecurrentTensor.placeholder((3,), domain=(i, t), name="h")
        h[t.eq(0)] = x
        h[True] = h[i, t - 1] * 0.5 + x
        p = RecurrentTensor.placeholder((3,), domain=(i, t), name="p")
        p[t.eq(0)] = tl.ones((3,))
        p[t.eq(big_t - 1)] = x[i, 0] * 3.0
        p[True] = h[i, t - 1]
        total = (p * x)[i, 0:big_t].sum()
    prog = _both([total], {}, backend)
    assert _vectorised(prog, "p")
    assert "recurrence" in _reason(prog, "h")
    assert len(_batched_op(prog, "p").inputs) == 3
    assert "vectorised p over t (merge: 3 runs, one branch each)" in prog.explain()


def test_piecewise_definitions_that_cannot_batch_say_why():
    ctx, i, t, big_i, big_t = ctx_it()
    with ctx:
        x = tl.from_numpy(_rand(2, 10, 3, seed=33), domain=(i, t))
        first = RecurrentTensor.placeholder((3,), domain=(i, t), name="first")
        first[i.eq(0) & t.eq(0)] = tl.zeros((3,))  # which branch depends on i
        first[True] = x
        even = RecurrentTensor.placeholder((3,), domain=(i, t), name="even")
        even[(t % 2).eq(0)] = x  # ten runs
        even[True] = x * 2.0
        wide = RecurrentTensor.placeholder((3,), domain=(i, t), name="wide")
        wide[t.eq(0)] = tl.zeros(())  # a branch of another shape
        wide[True] = x
        total = (first + even + wide)[i, 0:big_t].sum()
    prog = _both([total], {}, "numpy")
    assert "conditions depend on i" in _reason(prog, "first")
    assert "alternate in 10 runs" in _reason(prog, "even")
    assert "vectorised wide over" in " ".join(prog.report.notes)  # broadcast: an expand


def test_a_gradient_branch_defined_at_one_point_is_not_gathered():
    # autodiff of ``u[i, 0:1]`` places the gradient where t < 1 and zeros elsewhere: its
    # select_at exists only at t = 0, so the merge stays in its loop (found by the fuzzer)
    ctx, i, t, big_i, big_t = ctx_it()
    with ctx:
        u = tl.from_numpy(_rand(2, 2, seed=34).astype(np.float64), domain=(i, t))
        u.requires_grad = True
        y = u[i, 0:1].max(0)
        (y * y).sum().backward()
    _both([y, u.grad], {big_i: 2, big_t: 2}, "numpy")


def test_partial_range_reader_is_declined():
    ctx, t, big_t = ctx_t()
    with ctx:
        x = tl.from_numpy(_rand(6, 2, seed=16), domain=(t,))
        y = (x * 2.0).named("y")
        prefix = y[0 : t + 1].sum(0).named("prefix")
    prog = _both([prefix], {}, "numpy")
    assert "a part of the range" in _reason(prog, "y")


def test_outputs_keep_their_layout():
    ctx, i, t, big_i, big_t = ctx_it()
    with ctx:
        x = tl.from_numpy(_rand(2, 3, 2, seed=17), domain=(i, t))
        y = (x * 2.0).named("y")
    prog = _both([y], {}, "numpy")
    assert "output" in _reason(prog, "y")


def test_switch_turns_the_pass_off():
    ctx, i, t, big_i, big_t = ctx_it()
    with ctx:
        x = tl.from_numpy(_rand(2, 3, 2, seed=18), domain=(i, t))
        total = (x * 2.0)[i, 0:big_t].sum()
    prog = ctx.compile(outputs=[total], options=tl.CompileOptions(vectorize=False))
    assert not _notes(prog) and not _notes(prog, "not vectorised")
    assert _notes(ctx.compile(outputs=[total]))


def test_pipeline_without_optimisation_does_not_vectorise():
    ctx, i, t, big_i, big_t = ctx_it()
    with ctx:
        x = tl.from_numpy(_rand(2, 3, 2, seed=19), domain=(i, t))
        total = (x * 2.0)[i, 0:big_t].sum()
    static, dynamic = ctx.resolve_bounds({})
    spec = freeze([], [total.op], ctx.dims, ctx._until, static, dynamic)
    assert not any(
        n.startswith("vectorised")
        for n in compile_program(spec, tl.CompileOptions(optimize=False)).report.notes
    )
    assert any(n.startswith("vectorised") for n in compile_program(spec).report.notes)


# --- PPO ------------------------------------------------------------------------------------------


def test_ppo_batches_the_critic_and_log_probabilities():
    from timerl.rl.algos import ppo

    algo = ppo(num_envs=2, num_steps=4, epochs=1, minibatches=1, hidden=(8,))
    prog = algo.ctx.compile(bounds={"I": 2, **algo.bounds})
    assert _vectorised(prog, "value") and _vectorised(prog, "logp")


def _ppo_metrics(algo_name, backend, options=None):
    from timerl.rl import algos

    build = getattr(algos, algo_name)
    extra = {"epochs": 2, "minibatches": 2} if algo_name == "ppo" else {}
    algo = build(num_envs=2, num_steps=8, hidden=(8,), **extra)
    outputs = list(algo.metrics.values())
    prog = algo.ctx.compile(
        bounds={"I": 3, **algo.bounds}, outputs=outputs, backend=backend, options=options
    )
    prog.run()
    return prog, [prog.value(m) for m in outputs]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("algo", ["ppo", "reinforce"])
def test_training_programs_match_the_point_by_point_schedule(algo, backend):
    prog, got = _ppo_metrics(algo, backend)
    assert _notes(prog)
    plain, want = _ppo_metrics(algo, backend, tl.CompileOptions(vectorize=False))
    assert not _notes(plain)
    for g, w in zip(got, want, strict=True):
        close(g, w, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("backend", BACKENDS)
def test_take_matmul_with_only_its_indices_along_t_is_batched(backend, monkeypatch):
    monkeypatch.setattr(rowwise, "CHUNK_BYTES", 16)  # the rule fires for gathers above a chunk
    ctx, t, big_t = ctx_t()
    perms = np.stack([np.random.RandomState(k).permutation(7)[:4] for k in range(5)])
    with ctx:
        x = tl.from_numpy(_rand(7, 3, seed=3))
        w = tl.from_numpy(_rand(3, 2, seed=4))
        idx = tl.from_numpy(perms, domain=(t,))
        h = (x.take(idx) @ w).named("h")  # simplification makes it one take_matmul
        total = h[0:big_t].sum().named("total")
    prog = _both([total], {}, backend)
    assert _vectorised(prog, "h")
    assert "take_matmul" in {op.prim for op in prog.compiled.spec.ops}


@pytest.mark.parametrize("backend", BACKENDS)
def test_weights_read_inside_a_nested_recurrence_stay_in_the_update_loop(backend):
    """``w[i, u + 1] = w[i, u] - lr * grad``, the gradient through a recurrence over ``s``
    inside each update: ``w[i, u]`` feeds the recurrence's backward pass (``w.T``) and so
    the next update. The dependence runs through the reads at ``s + 1``, inside ``u``'s loop:
    batching ``w.T`` over ``u`` would need every update's weights before the first update
    (a dependence cycle); it stays in the loop and the weights equal a plain loop's."""
    from timerl.api.nn import Module, parameter
    from timerl.api.optim import SGD

    w0 = 0.5 * _rand(3, 3, seed=3)
    h0 = _rand(3, seed=4)
    ctx = tl.Context(dims=("i", "u", "s"))
    i, u, s = ctx.dims
    with ctx:

        class Net(Module):
            def __init__(self):
                self.w = parameter(w0, (i,), "w")

        net = Net()
        learner = net.unroll(u)
        g = RecurrentTensor.placeholder((3,), "float32", (i, u, s), name="g")
        g[i, u, 0] = tl.from_numpy(h0)
        out = (g @ learner.w).tanh()
        g[i, u, s + 1] = out
        loss = (out[i, u, 0 : s.bound] ** 2.0).sum()
        loss.backward(inputs=[learner.w])
        SGD([learner.w], lr=0.1).step()
        final = net.w[2]
    prog = _both([final], {"I": 3, "U": 2, "S": 3}, backend)
    assert any(" over u" in n for n in _notes(prog, "not vectorised"))
    w = w0.astype(np.float64)
    for _ in range(2 * 2):  # two iterations of two updates each
        hs, state = [], h0.astype(np.float64)
        for _ in range(3):
            state = np.tanh(state @ w)
            hs.append(state)
        grad, back = np.zeros_like(w), np.zeros(3)
        for k in reversed(range(3)):  # d loss / d out[k], through out[k + 1]
            prev = hs[k - 1] if k else h0.astype(np.float64)
            dz = (2.0 * hs[k] + back) * (1.0 - hs[k] ** 2)
            grad += np.outer(prev, dz)
            back = dz @ w.T
        w = w - 0.1 * grad
    close(prog.value(final), w, rtol=1e-4, atol=1e-5)
