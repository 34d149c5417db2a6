"""The jax backend computes what the numpy reference computes (values, gradients, random
numbers, declared dtypes), and compiles runs of pure statements as jitted regions that are
traced once per program, whatever the number of runs."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest

import timerl as tl
from timerl.errors import BackendError
from timerl.ir.build import apply
from timerl.runtime.backend import make_backend

jax = pytest.importorskip("jax")


def test_a_missing_jax_extra_is_named(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "jax" else real(name, *a)
    )
    with pytest.raises(BackendError, match=r"backend 'jax' needs .*pip install 'timerl\[jax\]'"):
        make_backend("jax")


def test_an_unknown_jax_device_is_refused():
    with pytest.raises(BackendError, match="device 'tpu:7' asked for"):
        make_backend("jax", device="tpu:7")


def _readme():
    ctx = tl.Context(dims=("t",))
    (t,), (T,) = ctx.dims, ctx.bounds
    with ctx:
        x = tl.RecurrentTensor.placeholder(shape=(3,), domain=(t,))
        x[0] = tl.zeros((3,))
        x[t + 1] = x[t] * 0.5 + 1.0
        r = tl.from_numpy(np.arange(10.0), domain=(t,))
        ret = tl.RecurrentTensor.placeholder(shape=(), domain=(t,))
        ret[t.eq(T - 1)] = r
        ret[True] = r + 0.9 * ret[t + 1]
        prefix = x[0 : t + 1].mean(0)
        future = r[t:T].sum(0)
    return [x, ret, prefix, future], {T: 10}


def _policy(dtype: str):
    """A small recurrent policy: matmul, tanh, random noise, a loss over a slice, gradients."""
    ctx = tl.Context(dims=("t",))
    (t,), (T,) = ctx.dims, ctx.bounds
    w0 = np.random.default_rng(0).normal(size=(4, 4)) * 0.5
    with ctx:
        w = tl.from_numpy(w0, dtype=dtype, requires_grad=True)
        x = tl.RecurrentTensor.placeholder(shape=(4,), dtype=dtype, domain=(t,))
        x[0] = tl.ones((4,), dtype=dtype)
        h = (x[t].reshape((1, 4)) @ w).reshape((4,))
        x[t + 1] = (h * 0.5 + tl.rand((4,), like=x) - tl.randn((4,), like=x) * 0.1).tanh()
        loss = (x[0:T].sum(0) ** 2).sum() + (x[t] * x[t]).sum().exp().sum()
        loss.backward()
    return ctx, {T: 6}, [x, w.grad]


@pytest.mark.parametrize("optimize", [True, False])
def test_evaluate_on_jax_matches_numpy(optimize):
    outs, bounds = _readme()
    want = tl.evaluate(outs, bounds=bounds, optimize=optimize)
    got = tl.evaluate(outs, bounds=bounds, backend="jax", optimize=optimize)
    for a, b in zip(want, got, strict=True):
        assert isinstance(b, np.ndarray) and b.dtype == a.dtype
        np.testing.assert_allclose(b, a, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("compiled", [True, False])
def test_gradients_and_random_numbers_match_numpy(dtype, compiled):
    values = {}
    for backend in ("numpy", "jax"):
        ctx, bounds, outs = _policy(dtype)
        prog = ctx.compile(bounds=bounds, outputs=outs, backend=backend, seed=5)
        prog.run(compiled=compiled)
        values[backend] = [prog.value(o) for o in outs]
    for a, b in zip(values["numpy"], values["jax"], strict=True):
        assert b.dtype == np.dtype(dtype)  # jax's 32-bit default does not leak in
        tol = 1e-5 if dtype == "float32" else 1e-12
        np.testing.assert_allclose(b, a, rtol=tol, atol=tol)


def test_mixed_dtypes_promote_as_numpy_declares():
    ctx = tl.Context(dims=("t",))
    _, (T,) = ctx.dims, ctx.bounds
    with ctx:
        i = tl.arange(3)  # int64
        y = tl.full((3,), 0.5) + i  # numpy: float32 + int64 -> float64
        z = (y * 2.0 + 1.0).sum()
    want = tl.evaluate([y, z], bounds={T: 2})
    got = tl.evaluate([y, z], bounds={T: 2}, backend="jax")
    for a, b in zip(want, got, strict=True):
        assert b.dtype == a.dtype
        np.testing.assert_array_equal(b, a)


def test_regions_are_jitted_once_per_program():
    ctx, bounds, outs = _policy("float32")
    prog = ctx.compile(bounds=bounds, outputs=outs, backend="jax")
    prog.run()
    first = [prog.value(o) for o in outs]
    stats = prog.stats()
    assert stats["jit_regions"] >= 3  # the rollout body, the loss, the backward steps
    # a region holding merges traces once per combination of branches it meets (t = 0, ...)
    assert stats["jit_regions"] <= stats["jit_traces"] <= 3 * stats["jit_regions"]
    assert stats["jit_trace_compile_seconds"] > 0
    assert "REGION" in prog._executor().source
    prog.run()  # a fresh executor regenerates its code: the regions are found, not retraced
    again = prog.stats()
    assert again["jit_traces"] == stats["jit_traces"]
    assert again["jit_trace_compile_seconds"] == stats["jit_trace_compile_seconds"]
    for a, b in zip(first, [prog.value(o) for o in outs], strict=True):
        np.testing.assert_array_equal(a, b)
    assert f"jax regions (built when the program runs): {stats['jit_regions']} jitted" in (
        prog.explain()
    )


@pytest.mark.parametrize("backend", ["numpy", "torch"])
def test_other_backends_generate_no_regions(backend):
    if backend == "torch":
        pytest.importorskip("torch")
    ctx, bounds, outs = _policy("float32")
    prog = ctx.compile(bounds=bounds, outputs=outs, backend=backend)
    prog.run()
    assert "REGION" not in prog._executor().source
    assert "jit_traces" not in prog.stats()


@pytest.mark.parametrize("numpy_regions", ["1", "0"])
def test_a_user_function_between_pure_ops_runs_on_the_host(numpy_regions, monkeypatch):
    """A udf inside a run of pure ops splits it: it is called with numpy arrays, never traced.
    The runs around it are small and the loop calls it at each point, so they run as numpy
    kernels; ``TIMERL_NUMPY_REGIONS=0`` jits them instead, to the same values."""
    monkeypatch.setenv("TIMERL_NUMPY_REGIONS", numpy_regions)
    seen = []

    def host(a: np.ndarray) -> np.ndarray:
        assert isinstance(a, np.ndarray)  # not a tracer, not a jax array
        seen.append(a.copy())
        return np.sort(a)[::-1].copy()

    ctx = tl.Context(dims=("t",))
    (t,), (T,) = ctx.dims, ctx.bounds
    with ctx:
        x = tl.RecurrentTensor.placeholder(shape=(3,), domain=(t,))
        x[0] = tl.from_numpy(np.array([0.3, -0.2, 0.1], dtype=np.float32))
        a = (x[t] * 1.5).tanh() + 0.25
        b = tl.RecurrentTensor(
            apply("udf", a.view, fn=host, shape=(3,), dtype=np.dtype("float32")), ctx
        )
        x[t + 1] = (b * 0.5 - a).sin() * 2.0
    want = tl.evaluate(x, bounds={T: 5})
    n = len(seen)
    prog = ctx.compile(bounds={T: 5}, outputs=[x], backend="jax")
    prog.run()
    stats = prog.stats()
    assert len(seen) - n == 4
    if numpy_regions == "1":  # the two runs around the udf; the ops before the loop jitted
        assert stats["numpy_regions"] == 2 and stats["jit_regions"] == 1
        assert "regions run as numpy kernels" in prog.explain()
        np.testing.assert_array_equal(prog.value(x), want)  # the reference's own kernels
    else:
        assert stats["numpy_regions"] == 0 and stats["jit_regions"] >= 2
        assert "numpy kernels" not in prog.explain()
        np.testing.assert_allclose(prog.value(x), want, rtol=1e-6)


def test_a_dynamic_loop_runs_on_jax():
    ctx = tl.Context(dims=("i", "t"))
    i, t = ctx.dims
    big_i, big_t = ctx.bounds
    with ctx:
        x = tl.RecurrentTensor.placeholder((), domain=(i, t))
        x[i, 0] = tl.zeros(())
        x[i, t + 1] = (x[i, t] + 1.0) * 1.0 + 0.0 * x[i, t]
        ctx.until(t, x >= tl.full((), i) + 2.0)
        s = x[i, 0:big_t].sum(0)
    bounds = {big_i: 3, big_t: 50}
    want = tl.evaluate(s, bounds=bounds)
    got = tl.evaluate(s, bounds=bounds, backend="jax")
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("numpy_regions", ["1", "0"])
def test_a_ppo_program_on_jax_matches_numpy(numpy_regions, monkeypatch):
    """A whole training program: env steps (host calls) between regions, merges in regions,
    recurrences read across iterations of the outer loop; the metrics agree with numpy's,
    with the rollout's policy step run as numpy kernels or (``TIMERL_NUMPY_REGIONS=0``) as
    a jitted region."""
    from timerl.rl.algos import ppo

    monkeypatch.setenv("TIMERL_NUMPY_REGIONS", numpy_regions)
    got = {}
    for backend in ("numpy", "jax"):
        prog = ppo(env_id="CartPole-v1", num_envs=2, num_steps=8, epochs=2, minibatches=2)
        metrics = list(prog.metrics.values())
        c = prog.ctx.compile(bounds={"I": 4, **prog.bounds}, outputs=metrics, backend=backend)
        c.run()
        got[backend] = [np.asarray(c.value(m), dtype=np.float64) for m in metrics]
        if backend == "jax":
            traces = c.stats()["jit_traces"]
            assert traces > 0
            # the update and GAE stay compiled; the policy's step is kernels or one region
            assert "for u in 0 .. U-1 (" in c.explain() and "-> one XLA loop" in c.explain()
            kernels = "ops in the loop over t (obs, action)" in c.explain()
            assert kernels == (numpy_regions == "1")
            c.run()
            assert c.stats()["jit_traces"] == traces
    for a, b in zip(got["numpy"], got["jax"], strict=True):
        np.testing.assert_allclose(b, a, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("numpy_regions", ["1", "0"])
def test_a_host_env_step_costs_one_jitted_call_or_none(numpy_regions, monkeypatch):
    """With a host env the rollout's regions are split at the env call: the policy's region is
    one jitted call per step (``TIMERL_NUMPY_REGIONS=0``), or, small as it is, numpy kernels
    and no call at all; the env's results (numpy arrays, taken apart outside regions) need
    none. So eight more steps per iteration make eight more calls each, or none."""
    from timerl.rl.algos import ppo

    monkeypatch.setenv("TIMERL_NUMPY_REGIONS", numpy_regions)
    calls = {}
    for steps in (8, 16):
        obs = {}
        for backend in ("numpy", "jax"):
            prog = ppo(env_id="CartPole-v1", num_envs=2, num_steps=steps, minibatches=1)
            x = prog.rollout["obs"]
            c = prog.ctx.compile(bounds={"I": 3, **prog.bounds}, outputs=[x], backend=backend)
            c.run()
            obs[backend] = c.value(x)
        np.testing.assert_allclose(obs["jax"], obs["numpy"], rtol=1e-4, atol=1e-5)
        before = c.stats()["jit_calls"]
        c.run()  # traced and compiled: count one run's calls
        calls[steps] = c.stats()["jit_calls"] - before
    assert calls[16] - calls[8] == (3 * 8 if numpy_regions == "0" else 0)


def test_the_training_driver_runs_on_jax_and_agrees_with_numpy():
    """What ``timerl train reinforce --backend jax`` runs: the hooked outer loop, metrics sink."""
    from timerl.cli import build_parser
    from timerl.rl.train import train

    args = build_parser().parse_args(["train", "reinforce", "--backend", "jax"])
    assert args.backend == "jax"
    records: dict[str, list] = {"numpy": [], "jax": []}
    for b in records:
        train(
            "reinforce",
            {"num_envs": 2, "num_steps": 8},
            iterations=2,
            backend=b,
            progress=False,
            on_iteration=lambda rec, b=b: records[b].append(dict(rec)),
        )
    assert len(records["jax"]) == len(records["numpy"]) == 2
    for want, got in zip(records["numpy"], records["jax"], strict=True):
        keys = [k for k in want if k not in ("seconds", "steps_per_second") and "time" not in k]
        assert "loss" in keys
        for k in keys:
            if isinstance(want[k], float):
                np.testing.assert_allclose(got[k], want[k], rtol=1e-4, atol=1e-6, err_msg=k)


def test_a_region_merge_selects_its_branch_traced_even_over_values_not_computed():
    """A merge in a jitted region gets every branch (zeros where a point does not exist or a
    local was computed only under a guard that did not hold) and the taken one's index, so
    the first point and the rest share a trace; values stay the reference's."""
    ctx = tl.Context(dims=("t",))
    (t,), (T,) = ctx.dims, ctx.bounds
    u0 = np.array([0.0438, 0.3988, -0.4603])
    u1 = np.array([0.3490, 0.8161, 0.3703])
    with ctx:
        a = tl.from_numpy(u0, domain=(t,), dtype="float64")
        b = tl.from_numpy(u1, domain=(t,), dtype="float64")
        x1 = tl.RecurrentTensor.placeholder((), dtype="float64", domain=(t,))
        first = a[0] * 0.25 - 0.5 + a[0:T].sum(0).tanh()
        x1[T - 1] = first + tl.where(a[T - 1] * 0.5 + 1.0 > 0, a[0:T].mean(0), b[0:2].sum(0))
        x1[t] = (x1[t + 1] * 0.5 + x1[t + 1] * 2.0).tanh()
        x2 = tl.RecurrentTensor.placeholder((), dtype="float64", domain=(t,))
        x2[t.eq(T - 1)] = b[t:T].min(0)
        x2[True] = (x2[t + 1] * 0.5 + x2[t + 1]).tanh()
    want = tl.evaluate([x1, x2], bounds={T: 3}, backend="numpy")
    got = tl.evaluate([x1, x2], bounds={T: 3}, backend="jax")
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-12)


def _host_loop(shape: tuple[int, ...], n_ops: int) -> tuple:
    """A loop over t calling a udf at each point, around a chain of ``n_ops`` elementwise ops
    on arrays of ``shape``: the region the cost rule decides about."""
    ctx = tl.Context(dims=("t",))
    (t,), (T,) = ctx.dims, ctx.bounds
    with ctx:
        x = tl.RecurrentTensor.placeholder(shape=shape, domain=(t,))
        x[0] = tl.from_numpy(np.full(shape, 0.1, dtype=np.float32))
        a = x[t]
        for k in range(n_ops):
            a = (a * 0.5).tanh() if k % 2 else a + 0.25
        b = tl.RecurrentTensor(
            apply("udf", a.view, fn=lambda v: v * 0.5, shape=shape, dtype=np.dtype("float32")),
            ctx,
        )
        x[t + 1] = b
    return ctx, x, {T: 3}


@pytest.mark.parametrize(
    ("shape", "n_ops", "kernels"),
    [
        ((16, 4), 6, True),  # a few small ops: numpy's kernels cost less than a jitted call
        ((16, 4), 40, False),  # forty kernels cost more than one call
        ((1200, 1000), 4, False),  # millions of operations: compiled, dispatch is noise
    ],
)
def test_the_cost_rule_picks_numpy_kernels_for_small_regions_only(shape, n_ops, kernels):
    from timerl.compiler import fusion_regions as regions

    ctx, x, bounds = _host_loop(shape, n_ops)
    want = tl.evaluate(x, bounds=bounds)
    prog = ctx.compile(bounds=bounds, outputs=[x], backend="jax")
    prog.run()
    stats = prog.stats()
    # the ops before the loop are one jitted region either way (top level: called once)
    assert stats["numpy_regions"] == (1 if kernels else 0)
    assert stats["jit_regions"] == (1 if kernels else 2)
    explained = prog.explain()
    if kernels:
        why = next(line for line in explained.splitlines() if "ops in the loop over t" in line)
        kernels_launched = int(why.split(": ")[1].split()[0])
        assert kernels_launched * regions.NUMPY_OP_US < regions.JIT_CALL_US
        assert "calls udf#" in why and why.endswith("at each point")
        np.testing.assert_array_equal(prog.value(x), want)
    else:
        assert "numpy kernels" not in explained
        np.testing.assert_allclose(prog.value(x), want, rtol=1e-5)


def _merge_reshape_add() -> tuple:
    """The ops of ``x[t].reshape((2, 2)) + 1.0`` for a recurrence ``x``: (merge, reshape,
    add), the merge picking ``x``'s definition at each point."""
    ctx = tl.Context(dims=("t",))
    (t,), _ = ctx.dims, ctx.bounds
    with ctx:
        x = tl.RecurrentTensor.placeholder((4,), domain=(t,))
        x[0] = tl.full((4,), 1.0)
        x[t + 1] = x[t] * 0.5
        y = x[t].reshape((2, 2)) + 1.0
    add = y.view.op
    reshape = add.inputs[0].src
    ops = (reshape.inputs[0].src, reshape, add)
    assert [op.prim for op in ops] == ["merge", "reshape", "add"]
    return ops


def test_views_and_merges_launch_no_kernel_in_the_cost_rule():
    """A region's count for the cost rule is of the ops that launch a numpy kernel: a merge
    picks one of its inputs and a reshape is a view, so neither counts (a region of PPO's
    carried parameters, all merges, cost 1 ms as a jitted call)."""
    from timerl.compiler.fusion_regions import kernel_ops

    merge, reshape, add = _merge_reshape_add()
    assert kernel_ops([merge, reshape]) == 0
    assert kernel_ops([merge, add, reshape]) == 1


def test_no_kernel_computes_on_a_value_a_jitted_call_still_computes():
    """A region whose kernel reads a value computed in compiled code (directly, or through
    the region's views) stays one jitted call: as kernels numpy would wait for XLA there."""
    from timerl.compiler.fusion_regions import computes_on
    from timerl.schedule.fused import Region

    merge, reshape, add = _merge_reshape_add()
    assert computes_on(Region(ops=[reshape, add]), {merge.id})
    assert not computes_on(Region(ops=[reshape, add]), set())
    assert not computes_on(Region(ops=[reshape]), {merge.id})  # a view only passes it


def test_numpy_regions_only_in_loops_that_call_the_host():
    """The same small ops in a loop with no host call run as one XLA loop, not as kernels."""
    ctx = tl.Context(dims=("t",))
    (t,), (T,) = ctx.dims, ctx.bounds
    with ctx:
        x = tl.RecurrentTensor.placeholder(shape=(16, 4), domain=(t,))
        x[0] = tl.from_numpy(np.full((16, 4), 0.1, dtype=np.float32))
        x[t + 1] = (x[t] * 0.5).tanh() + 0.25
    prog = ctx.compile(bounds={T: 3}, outputs=[x], backend="jax")
    prog.run()
    assert prog.stats()["numpy_regions"] == 0
    assert "one XLA loop" in prog.explain()


def test_a_kernel_region_converts_a_jax_array_it_reads_once():
    """A value from outside a region run as numpy kernels is read as a numpy array; the same
    small jax array read again (a parameter at every step) is not converted again."""
    from timerl.runtime.regions import REMEMBER_ELEMENTS, AsNumpy

    read = AsNumpy()
    w = jax.numpy.arange(6.0).reshape(2, 3)
    first = read(w)
    assert isinstance(first, np.ndarray) and read(w) is first
    np.testing.assert_array_equal(first, np.arange(6.0).reshape(2, 3))
    plain = np.ones(4)
    assert read(plain) is plain and read(w) is first
    big = jax.numpy.zeros(REMEMBER_ELEMENTS + 1)
    assert isinstance(read(big), np.ndarray) and read(w) is first  # a large one is not kept


def test_a_region_reads_a_value_whose_guard_did_not_hold_as_absent():
    """A loop's fused region reads a local that is set only where its guard held (the last
    step here): at the first iteration it was never assigned. Both kinds of region read
    such a value as absent, through one ``OPTIONAL`` (the loop's own version let the unbound
    name escape)."""
    ctx = tl.Context(dims=("t",))
    (t,), (T,) = ctx.dims, ctx.bounds
    with ctx:
        u = tl.from_numpy(np.array([[0.28, -0.94], [0.18, 0.91]]), domain=(t,), requires_grad=True)
        x1 = tl.RecurrentTensor.placeholder((2,), dtype="float64", domain=(t,))
        x1[T - 1] = u[0:T].max(0)
        x1[t] = (x1[t + 1] * 0.5 + u[0:1].max(0)).tanh()
        x2 = tl.RecurrentTensor.placeholder((), dtype="float64", domain=(t,))
        x2[t.eq(T - 1)] = x1[0 : t + 1].max(0).sigmoid().sum(-1)
        x2[True] = (x2[t + 1] * 0.5 + (x2[t + 1] * 2.0 - 0.5) * x2[t + 1].sin()).tanh()
        (x2 * x2).sum().backward()
    outs = [x1, x2, u.grad]
    ref = tl.evaluate(outs, bounds={T: 2}, optimize=False)
    got = tl.evaluate(outs, bounds={T: 2}, backend="jax")
    for a, b in zip(ref, got, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-12)


def test_a_fused_loop_reads_a_value_computed_before_it_under_a_guard_that_failed():
    """A value computed before a fused loop, only where its guard holds (here at no point of
    the run), is passed to the loop as absent, not as a name never assigned (a program the
    fuzzer drew with ``TIMERL_FUZZ_SEED=1``, as it printed it)."""
    ctx = tl.Context(dims=("t",))
    (t,), (T,) = ctx.dims, ctx.bounds
    with ctx:
        u0 = tl.from_numpy(np.array([-0.676, -0.244, 0.024, 0.238]), domain=(t,), dtype="float64")
        p1 = tl.RecurrentTensor.placeholder((), dtype="float64", domain=(t,))
        p1[t < 2] = (
            (tl.where((u0[T - 1]) > 0, u0[t : tl.min(t + 2, T)].mean(0), u0[t // 3]))
            + ((u0[t + 1 : T].sum(0)).sin())
        ) * 0.25 + 1.0
        p1[t.eq(0)] = (
            (tl.where((u0[t : tl.min(t + 2, T)].sum(0)) > 0, u0[t // 2], u0[tl.min(t + 3, T - 1)]))
            * 0.25
            + 0.0
        ) * (tl.maximum((u0[t // 2]) * 0.25 + -0.5, -(u0[t : tl.min(t + 3, T)].max(0))))
        p1[True] = (u0[t % 2]) * (
            tl.where(
                ((u0[0:T].max(0)) * 0.5 + 0.0) > 0,
                tl.where((u0[t]) > 0, u0[t], u0[0:3].mean(0)),
                u0[tl.min(t + 2, T - 1)],
            )
        )
        x2 = tl.RecurrentTensor.placeholder((), dtype="float64", domain=(t,))
        x2[T - 1] = p1[0:4].min(0)
        x2[t] = (((x2[t + 1]) * 0.5 + 0.0) + (x2[t + 1])).tanh()
    ref = tl.evaluate([p1, x2], bounds={T: 4}, optimize=False)
    got = tl.evaluate([p1, x2], bounds={T: 4}, backend="jax")
    for a, b in zip(ref, got, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-12)


def _u(shape: tuple[int, ...], seed: int) -> np.ndarray:
    return np.random.default_rng(seed).uniform(-1.0, 1.0, shape)


def test_a_fused_loop_returns_the_last_value_of_one_it_keeps_whole():
    """``x1[i, t]`` is read by the next outer iteration at every ``t`` (``x1[0:i + 1, t]``)
    and its last point after the loop: the loop keeps its rows and returns the last of them
    (it was looked up among the values carried from iteration to iteration, which it is not).
    Found by the fuzzer's two-dim programs on jax."""
    ctx = tl.Context(dims=("i", "t"))
    (i, t), (I, T) = ctx.dims, ctx.bounds
    with ctx:
        u0 = tl.from_numpy(_u((4, 6), 40), domain=(i, t), dtype="float64")
        x1 = tl.RecurrentTensor.placeholder((), dtype="float64", domain=(i, t))
        x1[i, 0] = u0[tl.min(i + 1, I - 1), 0:T].max(0)
        x1[i, t + 1] = (((x1[0 : i + 1, t].sum(0)) * 0.5 + 0.0) + (x1[i, t])).tanh()
    ref = tl.evaluate([x1], bounds={I: 4, T: 6}, optimize=False)
    got = tl.evaluate([x1], bounds={I: 4, T: 6}, backend="jax")
    np.testing.assert_allclose(got[0], ref[0], rtol=1e-6, atol=1e-12)


def test_a_fused_loop_gathers_rows_read_over_a_slice_of_the_outer_dim():
    """A loop over ``t`` reading ``x[0:I, t]``-like rows of an earlier fused loop's store:
    rows of several outer points are gathered, not handed over as one stacked array (the
    stacked read has no key for a slice). Found by the fuzzer's two-dim gradient programs."""
    ctx = tl.Context(dims=("i", "t"))
    (i, t), (I, T) = ctx.dims, ctx.bounds
    with ctx:
        u0 = tl.from_numpy(_u((4, 3, 2), 41), domain=(i, t), dtype="float64", requires_grad=True)
        x1 = tl.RecurrentTensor.placeholder((), dtype="float64", domain=(i, t))
        head = u0[3, t : tl.min(t + 2, T)].max(0).max(-1)
        x1[t.eq(0)] = head * head
        window = u0[tl.min(i + 2, I - 1), tl.max(t - 3, 0) : t + 1].max(0)
        x1[True] = (
            (x1[i, t - 1] * 0.5 + 0.0) + tl.maximum(x1[i, t - 1], window).mean(-1) * -1.5 + 1.0
        ).tanh()
        (x1 * x1).sum().backward()
    ref = tl.evaluate([x1, u0.grad], bounds={I: 4, T: 3}, optimize=False)
    got = tl.evaluate([x1, u0.grad], bounds={I: 4, T: 3}, backend="jax")
    for a, b in zip(ref, got, strict=True):
        np.testing.assert_allclose(b, a, rtol=1e-6, atol=1e-12)


def test_an_outer_iteration_fused_whole_reads_a_guarded_value_through_optional():
    """A fused outer iteration (a body region) reading a value computed under a guard goes
    through ``OPTIONAL``, which must be in the generated code's namespace although no loop
    region of the program put it there. Found by the fuzzer's two-dim gradient programs."""
    ctx = tl.Context(dims=("i", "t"))
    (i, t), (I, T) = ctx.dims, ctx.bounds
    with ctx:
        u0 = tl.from_numpy(_u((3, 2, 3), 42), domain=(i, t), dtype="float64", requires_grad=True)
        u1 = tl.from_numpy(_u((3, 2), 43), domain=(i, t), dtype="float64", requires_grad=True)
        lag1 = u0[i % 3, t // 2]
        (lag1 * lag1).sum().backward()
    outs = [lag1, u0.grad, u1.grad]  # u1 takes no part: its gradient is zeros
    ref = tl.evaluate(outs, bounds={I: 3, T: 2}, optimize=False)
    got = tl.evaluate(outs, bounds={I: 3, T: 2}, backend="jax")
    for a, b in zip(ref, got, strict=True):
        np.testing.assert_allclose(b, a, rtol=1e-6, atol=1e-12)
