"""The optimised generated code must agree with the reference (``compiled=False``: each
statement of the schedule emitted on its own), value for value and byte for byte of accounted
memory."""

from __future__ import annotations

import re

import numpy as np
import pytest
from core_helpers import counting, until_program

import timerl as tl
from timerl.rl.algos import ppo, reinforce


def _recurrences():
    ctx = tl.Context(dims=("i", "t"))
    i, t = ctx.dims
    I, T = ctx.bounds
    with ctx:
        x = tl.RecurrentTensor.placeholder((3,), domain=(i, t))
        x[i, 0] = tl.full((3,), 1.0) * tl.full((), i)
        x[i, t + 1] = (x[i, t] * 0.9).tanh() + tl.rand((3,), like=x)
        ret = tl.RecurrentTensor.placeholder((3,), domain=(i, t))
        ret[t.eq(T - 1)] = x
        ret[True] = x + ret[i, t + 1] * 0.5
        prefix = x[i, 0 : t + 1].mean(0)
        window = x[i, tl.max(t - 2, 0) : t + 1].sum(0)
        total = ret[i, 0:T].sum(0)
    return ctx, {I: 3, T: 7}, [x, ret, prefix, window, total]


@pytest.mark.parametrize("build", [_recurrences, until_program], ids=["recurrences", "until"])
@pytest.mark.parametrize("backend", ["numpy", "torch"])
def test_generated_code_matches_the_reference(build, backend):
    results = []
    for compiled in (False, True):
        ctx, bounds, outs = build()
        prog = ctx.compile(bounds=bounds, outputs=outs, backend=backend, seed=3)
        prog.run(compiled=compiled)
        stats = prog.stats()
        results.append(
            ([prog.value(o) for o in outs], stats["peak_bytes"], stats["live_bytes_at_end"])
        )
    (ref, ref_peak, ref_live), (got, peak, live) = results
    for a, b in zip(ref, got, strict=True):
        for x, y in zip(
            np.asarray(a, dtype=object).ravel(), np.asarray(b, dtype=object).ravel(), strict=True
        ):
            np.testing.assert_array_equal(x, y)
    assert (peak, live) == (ref_peak, ref_live)


@pytest.mark.parametrize("algo", [ppo, reinforce])
def test_rl_programs_match_the_reference(algo):
    kw = {"epochs": 2, "minibatches": 2} if algo is ppo else {}
    results = []
    for compiled in (False, True):
        prog = algo(env_id="CartPole-v1", num_envs=2, num_steps=8, **kw)
        metrics = list(prog.metrics.values())
        c = prog.ctx.compile(bounds={"I": 3, **prog.bounds}, outputs=metrics)
        c.run(compiled=compiled)
        results.append(([c.value(m) for m in metrics], c.stats()["peak_bytes"]))
    for a, b in zip(results[0][0], results[1][0], strict=True):
        np.testing.assert_array_equal(a, b)
    assert results[0][1] == results[1][1]


@pytest.mark.parametrize("compiled", [True, False])
def test_a_freed_value_is_released_at_its_free(compiled):
    """Once freed, a value must not live on in the executor (e.g. in a generated local)."""
    import weakref

    ctx = tl.Context(dims=("i", "t"))
    (i, t), (I, T) = ctx.dims, ctx.bounds
    refs, alive = [], []
    with ctx:
        w = tl.RecurrentTensor.placeholder((), dtype="float64", domain=(i,), name="w")
        w[0] = 1.0
        w[i + 1] = w * 0.5
        big = (tl.zeros((10_000,), dtype="float64") + w).named("big")  # one per i
        tl.sink(big, lambda v, p: refs.append(weakref.ref(v)))
        h = tl.RecurrentTensor.placeholder((), dtype="float64", domain=(i, t), name="h")
        h[i, 0] = big.sum()  # big's last reader: freed before the t loop runs
        h[i, t + 1] = h * 0.9
        tl.sink(h, lambda v, p: alive.append(refs[-1]() is not None))
    ctx.compile(bounds={I: 3, T: 4}).executor(compiled=compiled).run()
    assert len(alive) == 12 and not any(alive)


def test_generated_code_keeps_no_local_of_a_stored_value():
    """A value put in its store, or copied into its block's row, is read from there: its
    local is dropped at once, or the value would outlive its free until the next point
    reassigned the local (the previous iteration's parameters and Adam moments did, and the
    rollout's last observation through the whole update, unseen by the meter)."""
    import re

    prog = ppo(env_id="CartPole-v1", num_envs=2, num_steps=8, hidden=(8,))
    metrics = list(prog.metrics.values())
    c = prog.ctx.compile(bounds={"I": 2, **prog.bounds}, outputs=metrics)
    c.run()
    lines = [line.strip() for line in c._executor().source.splitlines()]
    stored = copied = 0
    for k, line in enumerate(lines):
        m = re.fullmatch(r"S(\d+)\[.*\] = v(\d+)", line)
        row = re.fullmatch(r"_b\[0\]\[.*\] = (v\d+)", line)
        if row is not None:
            copied += 1
            var = row.group(1)
        elif m is None or m.group(1) != m.group(2):
            continue
        else:
            stored += 1
            var = f"v{m.group(1)}"
        rest = lines[k + 1 :]
        nxt = next(
            (n for n, s in enumerate(rest) if s.startswith(("v", "_r =")) and " = K" in s), None
        )
        window = rest[:nxt]
        assert f"{var} = None" in window, (line, window[:6])
    assert stored > 20 and copied > 0


def test_a_guard_is_evaluated_once_per_loop_iteration():
    """PPO's update body guards hundreds of statements with the same few conditions (the last
    minibatch, the carried state): each is computed into a local once per iteration of the
    loop body, not spelled out at every statement (it was a third of the source)."""
    import collections
    import re

    runs = []
    for compiled in (False, True):
        prog = ppo(env_id="CartPole-v1", num_envs=2, num_steps=8, hidden=(8,))
        metrics = list(prog.metrics.values())
        c = prog.ctx.compile(bounds={"I": 3, **prog.bounds}, outputs=metrics)
        c.run(compiled=compiled)
        runs.append(([c.value(m) for m in metrics], c.stats()["peak_bytes"]))
    source = c._executor().source
    inline = collections.Counter(
        m.group(1) for m in re.finditer(r"^\s*(?:if|elif) (\(.* (?:and|or) .*\)):", source, re.M)
    )
    cached = re.findall(r"^\s*_g\d+ = (.*)$", source, re.M)
    assert len(cached) >= 3
    assert not inline or max(inline.values()) <= 2, inline.most_common(2)
    (ref, ref_peak), (got, peak) = runs
    for a, b in zip(ref, got, strict=True):
        np.testing.assert_array_equal(a, b)
    assert peak == ref_peak


def test_a_traceback_through_generated_code_shows_the_line_and_its_tensor():
    """The generated source is registered in linecache under a name of its own: an error in
    a kernel or a host function shows the generated line, whose comment names the tensor
    and where the user defined it; the entry goes when the function does."""
    import gc
    import linecache
    import traceback

    ctx, t, T, x = counting(4)
    with ctx:
        ctx.sink(x, lambda value, point: 1 / 0 if point["t"] == 2 else None)
    prog = ctx.compile(bounds={T: 3}, outputs=[x])
    with pytest.raises(ZeroDivisionError) as err:
        prog.run()
    shown = "".join(traceback.format_exception(err.value))
    frame = next(line for line in shown.splitlines() if "<timerl schedule" in line)
    name = frame.split('"')[1]
    after = shown.split(frame, 1)[1].splitlines()[1]
    assert "sink(" in after and "test_codegen.py" in after
    assert name in linecache.cache
    del prog, err
    gc.collect()
    assert name not in linecache.cache


def test_constant_meter_changes_are_emitted_as_one_with_the_same_peak():
    # the acting loop's kernels allocate and free temporaries of known size: each one's
    # count and peak test become one change by their sum, tested at their largest running
    # sum, with the reference's peak (checked on these programs above)
    prog = ppo(env_id="CartPole-v1", num_envs=2, num_steps=8)
    c = prog.ctx.compile(bounds={"I": 2, **prog.bounds}, outputs=list(prog.metrics.values()))
    ex = c.executor(compiled=True)
    ex.prepare(hooked=False)
    source = ex.source
    rollout = next(
        block for block in source.split("for ")[1:] if ".step (defined" in block.split("\n\n")[0]
    )
    body = rollout[: rollout.index(".step (defined")].splitlines()[1:]
    kernels = [line for line in body if "  # " in line]
    meter = [line for line in body if "M[0]" in line]
    assert len(kernels) >= 5 and len(meter) <= 3, "\n".join(body)


def test_meter_changes_under_a_guard_stay_there_when_a_loop_after_reads_before_it():
    # a guarded op of known size just before a loop that reads a store entry once before it
    # starts (found by the fuzzer: the guard's meter change was emitted after that read)
    ctx = tl.Context(dims=("i", "t"))
    (i, t), (I, T) = ctx.dims, ctx.bounds
    with ctx:
        u0 = tl.from_numpy(np.array([[0.1, 0.4], [0.2, 0.09]]), domain=(i, t), dtype="float64")
        u1 = tl.from_numpy(np.array([-0.15, 0.29]), domain=(i,), dtype="float64")
        y1 = u1[tl.min(i + 1, I - 1)]
        p2 = tl.RecurrentTensor.placeholder((), dtype="float64", domain=(i, t))
        p2[t.eq(T - 1)] = (tl.where(u0[tl.max(i - 1, 0), t] > 0, u1[i], u1[i]) + u1[i]).tanh()
        p2[t.eq(T - 1)] = y1[i]
        p2[True] = u0[i, t]
        p3 = tl.RecurrentTensor.placeholder((), dtype="float64", domain=(i, t))
        p3[i.eq(I - 1)] = u1[tl.max(i - 1, 0)]
        p3[True] = u1[i]
    want = tl.evaluate([y1, p2, p3], bounds={I: 2, T: 2}, optimize=False)
    got = tl.evaluate([y1, p2, p3], bounds={I: 2, T: 2})
    for a, b in zip(want, got, strict=True):
        np.testing.assert_array_equal(a, b)


def _acting_loop(source: str) -> tuple[list[str], int, int]:
    """The generated lines, and where the loop over steps that calls the env starts and
    where the first line after it is."""
    lines = source.splitlines()
    step = next(k for k, line in enumerate(lines) if ".step (defined" in line)
    start = max(k for k in range(step) if lines[k].lstrip().startswith("for "))
    indent = len(lines[start]) - len(lines[start].lstrip())
    end = next(
        k for k in range(start + 1, len(lines)) if len(lines[k]) - len(lines[k].lstrip()) <= indent
    )
    return lines, start, end


def _acting_loop_on(backend: str) -> tuple[list[str], int, int]:
    """CartPole PPO on ``backend``, generated and as the reference (the same values, checked), and
    the generated acting loop (``_acting_loop``)."""
    results = []
    for compiled in (False, True):
        prog = ppo(env_id="CartPole-v1", num_envs=2, num_steps=8)
        metrics = list(prog.metrics.values())
        c = prog.ctx.compile(bounds={"I": 2, **prog.bounds}, outputs=metrics, backend=backend)
        c.run(compiled=compiled)
        results.append([c.value(m) for m in metrics])
    for a, b in zip(*results, strict=True):
        np.testing.assert_array_equal(a, b)
    ex = c.executor(compiled=True)
    ex.prepare(hooked=False)
    return _acting_loop(ex.source)


def test_the_acting_loop_reads_its_parameters_and_blocks_once_before_it():
    # parameters and the rollout's blocks do not change inside the loop over steps: each is
    # read into a local before it, and the locals are cleared after it (a local left set
    # would keep a freed block alive)
    prog = ppo(env_id="CartPole-v1", num_envs=2, num_steps=8)
    c = prog.ctx.compile(bounds={"I": 2, **prog.bounds}, outputs=list(prog.metrics.values()))
    ex = c.executor(compiled=True)
    ex.prepare(hooked=False)
    lines, start, end = _acting_loop(ex.source)
    before = [line.strip() for line in lines[start - 20 : start]]
    hoisted = [
        line.split(" = ")[0] for line in before if re.match(r"_h\d+ = (S|BL)\d+\.get\(", line)
    ]
    body = lines[start + 1 : end]
    assert len(hoisted) >= 4
    assert not any(re.search(r"\bBL\d+\[", line) for line in body), "\n".join(body)
    assert all(any(name in line for line in body) for name in hoisted)
    assert all(name in lines[end] for name in hoisted) and lines[end].strip().endswith("None")


def test_on_torch_a_loop_over_a_blocks_rows_takes_them_from_views_made_before_it():
    # ``block[t]`` builds a torch view at each call; the rollout's blocks are split into
    # their rows' views once before the loop over steps, and those are cleared after it
    pytest.importorskip("torch")
    lines, start, end = _acting_loop_on("torch")
    views = dict(re.findall(r"(_h\d+) = ROWVIEWS\((_h\d+)\)", "\n".join(lines[start - 30 : start])))
    body = "\n".join(lines[start + 1 : end])
    assert len(views) >= 3
    assert all(re.search(rf"\b{v}\[d\d+_t\]", body) for v in views)
    assert not any(f"{entry}[0][" in body for entry in views.values())
    assert all(v in lines[end] for v in views) and lines[end].strip().endswith("None")


def test_on_numpy_block_rows_are_indexed_in_place():
    # numpy indexes a row in 60 ns, as fast as a list of views would: no views are made
    prog = ppo(env_id="CartPole-v1", num_envs=2, num_steps=8)
    c = prog.ctx.compile(bounds={"I": 2, **prog.bounds}, outputs=list(prog.metrics.values()))
    ex = c.executor(compiled=True)
    ex.prepare(hooked=False)
    assert "ROWVIEWS" not in ex.source and "[0][d" in ex.source


@pytest.mark.parametrize("backend", ["numpy", "torch"])
def test_the_env_steps_parts_and_a_points_row_are_subscripts_in_the_acting_loop(backend):
    # a part of the step's result and a point of an array computed before the loop are one
    # subscript each (``Backend.inline_lowerings``): no kernel call, the same values
    pytest.importorskip(backend)
    lines, start, end = _acting_loop_on(backend)
    body = [line.strip() for line in lines[start + 1 : end]]
    parts = [line for line in body if re.match(r"v\d+ = v\d+\[[012]\]  # CartPole-v1\.", line)]
    assert len(parts) == 3, "\n".join(body)
    assert any(re.match(r"v\d+ = v\d+\[d\d+_t\]  # ", line) for line in body)


def test_a_part_of_another_dtype_than_declared_is_still_cast_on_torch():
    # a host function that declares no result dtypes may return any: its parts keep the
    # kernel, which casts them to the part's declared dtype
    pytest.importorskip("torch")
    ctx = tl.Context(dims=("t",))
    (t,), (T,) = ctx.dims, ctx.bounds
    with ctx:
        x = tl.RecurrentTensor.placeholder((2,), domain=(t,))
        x[0] = tl.zeros((2,))
        pair = tl.api.functional.apply(
            "udf",
            x[t].view,
            fn=lambda a: (a.astype(np.float64) + 1, a > 0),
            shape=(),
            dtype=np.dtype(bool),
            effect=True,
            name="pair",
        )
        ctx.add_root(pair.op)
        first = tl.api.functional.apply(
            "tuple_get", pair, item=0, shape=(2,), dtype=np.dtype("float32")
        )
        x[t + 1] = tl.RecurrentTensor(first, ctx)
    c = ctx.compile(bounds={T: 3}, outputs=[x], backend="torch")
    c.run()
    assert c.value(x).dtype == np.float32
    np.testing.assert_array_equal(c.value(x), [[0, 0], [1, 1], [2, 2]])
    line = next(line for line in c._executor().source.splitlines() if "# tuple_get" in line)
    assert re.match(r"\s*v\d+ = K\d+\(v\d+\)", line), line


def test_a_value_read_at_another_point_is_released_at_its_free():
    """A value read at a later point lives in its store; its free takes it out of there: no
    name of the generated code may keep it alive after that, or it would outlive its free
    unseen by the meter until the next free."""
    import weakref

    ctx = tl.Context(dims=("i", "t"))
    (i, t), (I, T) = ctx.dims, ctx.bounds
    refs: list[tuple[int, weakref.ref]] = []
    stale: list[int] = []
    with ctx:
        # nothing else is freed from a store here: a later free would drop a lingering name
        big = (tl.zeros((10_000,), dtype="float64") + tl.full((), i)).named("big")
        tl.sink(big, lambda v, p: refs.append((p["i"], weakref.ref(v))))
        s = tl.RecurrentTensor.placeholder((), dtype="float64", domain=(i,), name="s")
        s[0] = 0.0
        s[True] = big[i - 1].sum()  # big's last reader, one point later
        h = (s + tl.full((), t)).named("h")  # after big[i - 1]'s free

        def check(v, p):
            stale.extend(j for j, r in refs if j < p["i"] and r() is not None)

        tl.sink(h, check)
    ctx.compile(bounds={I: 4, T: 3}).run()
    assert len(refs) == 4 and stale == []
