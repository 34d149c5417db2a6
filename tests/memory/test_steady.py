"""The planned peak applies a long loop's repeated iterations instead of replaying them
(``memory/steady.py``, ``budget._Steady``): the plan must be the full replay's, field for
field, and the run's meter must agree with it."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import numpy as np
import pytest

import timerl as tl
from timerl.ir import rowwise
from timerl.memory import replay as budget
from timerl.memory.steady import turning_points
from timerl.rl.algos import ppo, reinforce
from timerl.runtime.heap import MMAP_THRESHOLD
from timerl.schedule.program import Loop
from timerl.symbolic import min_


def _plan(prog, steady: bool, monkeypatch) -> budget.PlannedPeak:
    """``prog``'s planned peak as ``Program.planned_peak`` computes it, watched for repeats or
    replayed point by point."""
    monkeypatch.setattr(budget, "STEADY_MIN", 16 if steady else 10**12)
    spec = prog.compiled.spec
    return budget.planned_peak(
        prog.schedule,
        prog.ops,
        prog.compiled.storage,
        spec.static,
        spec.dynamic,
        prog.backend.donations(prog.compiled.donations, prog.ops),
        small=MMAP_THRESHOLD,
    )


def _same_plan(prog, monkeypatch) -> budget.PlannedPeak:
    fast, full = _plan(prog, True, monkeypatch), _plan(prog, False, monkeypatch)
    assert dataclasses.replace(fast, note="") == dataclasses.replace(full, note="")
    return fast


def _applied(plan: budget.PlannedPeak) -> int:
    words = plan.note.split(" iterations that repeat")[0].split()
    return int(words[-1]) if "repeat the one before" in plan.note else 0


def _recurrences(n_t: int, lag: int = 3):
    """A forward recurrence, a window read ``lag`` back only in the loop's second half, and a
    backward recurrence over it: frees whose points turn at ``T // 2`` and at the ends."""
    rng = np.random.default_rng(0)
    ctx = tl.Context(dims=("t",))
    (t,), (T,) = ctx.dims, ctx.bounds
    with ctx:
        u = tl.from_numpy(rng.standard_normal((n_t, 64)).astype(np.float32), domain=(t,))
        x = tl.RecurrentTensor.placeholder((64,), domain=(t,), name="x")
        x[t.eq(0)] = u
        x[True] = x[t - 1] * 0.5 + u
        y = tl.RecurrentTensor.placeholder((64,), domain=(t,), name="y")
        y[t < T // 2] = x * 2.0
        y[t < lag] = x
        y[True] = x[t - lag] + x
        back = tl.RecurrentTensor.placeholder((64,), domain=(t,), name="back")
        back[t.eq(T - 1)] = y
        back[True] = y + back[t + 1] * 0.9
        out = back[0].sum() + y[T - 1].sum()
    return ctx, {T: n_t}, [out]


def _through_time(n_t: int):
    """A loss over a tanh recurrence, with its gradient: the forward loop's points wait for
    the backward loop (live bytes grow for the whole forward loop, then fall)."""
    rng = np.random.default_rng(1)
    ctx = tl.Context(dims=("t",))
    (t,), (T,) = ctx.dims, ctx.bounds
    with ctx:
        w = tl.from_numpy(rng.standard_normal((32, 32)).astype(np.float32) * 0.1)
        w.requires_grad = True
        u = tl.from_numpy(rng.standard_normal((n_t, 32)).astype(np.float32), domain=(t,))
        h = tl.RecurrentTensor.placeholder((32,), domain=(t,), name="h")
        h[t.eq(0)] = u.tanh()
        h[True] = (h[t - 1] @ w + u).tanh()
        loss = (h * h).sum()[0:T].sum(0)
        loss.backward()
        outs = [loss, w.grad]
    return ctx, {T: n_t}, outs


@pytest.mark.parametrize("build", [_recurrences, _through_time], ids=["window", "bptt"])
def test_a_long_loop_plans_as_replayed_and_runs_at_its_plan(build, monkeypatch):
    ctx, bounds, outs = build(300)
    prog = ctx.compile(bounds=bounds, outputs=outs)
    plan = _same_plan(prog, monkeypatch)
    assert _applied(plan) > 200  # most of the 300 points were not replayed
    prog.run()
    assert prog.stats()["peak_bytes"] == plan.peak_bytes


def test_the_values_of_a_program_planned_by_repeats_are_the_reference(monkeypatch):
    ctx, bounds, outs = _through_time(120)
    want = tl.evaluate(outs, bounds=bounds, optimize=False)
    got = tl.evaluate(outs, bounds=bounds)
    for a, b in zip(want, got, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("algo", ["ppo", "reinforce"])
def test_rl_programs_plan_as_replayed(algo, monkeypatch):
    make = ppo if algo == "ppo" else reinforce
    program = make(env_id="CartPole-v1", num_envs=2, num_steps=200, hidden=(16,))
    prog = program.ctx.compile(
        bounds={"I": 3, **program.bounds}, outputs=list(program.metrics.values())
    )
    plan = _same_plan(prog, monkeypatch)
    assert _applied(plan) > 0


def test_a_budgeted_ppo_plans_as_replayed(monkeypatch):
    """Under a budget its rollout is streamed to disk: reads by chunks in the long loops."""
    monkeypatch.setattr(rowwise, "CHUNK_BYTES", 4 * 3 * 8 * 8 * 4)  # many chunks a read
    obs = {"obs_shape": (3, 8, 8), "episode_length": 1000, "action_dim": 2}
    program = ppo(env_id="Synthetic-v0", num_envs=2, num_steps=256, hidden=(16,), env_kwargs=obs)
    bounds = {"I": 3, **program.bounds}
    metrics = list(program.metrics.values())
    need = program.ctx.compile(bounds=bounds, outputs=metrics).planned_peak().peak_bytes
    rollout = 256 * 2 * 3 * 8 * 8 * 4
    prog = program.ctx.compile(bounds=bounds, outputs=metrics, memory_budget=need - rollout // 2)
    assert "streamed to disk" in prog.explain()
    _same_plan(prog, monkeypatch)


def _loops(body):
    for s in body:
        if isinstance(s, Loop):
            yield s
            yield from _loops(s.body)


def test_turning_points_are_where_guards_and_kept_points_change():
    ctx, bounds, outs = _recurrences(300, lag=3)
    prog = ctx.compile(bounds=bounds, outputs=outs)
    env = dict(prog.compiled.spec.static)
    donations = prog.backend.donations(prog.compiled.donations, prog.ops)
    turns = [
        turning_points(loop, env, donations, prog.compiled.storage)
        for loop in _loops(prog.schedule.body)
    ]
    bounded = [tp for tp in turns if tp is not None]
    assert bounded, "every loop of the program was left to a full replay"
    for tp in bounded:
        assert any(abs(v - 150) <= 2 for v in tp) or any(v <= 4 for v in tp)
        # nothing in the middle of either half turns
        assert not any(40 <= v <= 140 or 160 <= v <= 290 for v in tp)


def test_an_index_clamped_by_min_is_replayed_point_by_point(monkeypatch):
    """``x[min(t + 5, T - 1)]``: where the clamp bites is not a guard; the loop reading it, and
    the frees that follow it, are replayed in full, and the plan is still the replay's."""
    rng = np.random.default_rng(2)
    ctx = tl.Context(dims=("t",))
    (t,), (T,) = ctx.dims, ctx.bounds
    with ctx:
        u = tl.from_numpy(rng.standard_normal((200, 16)).astype(np.float32), domain=(t,))
        x = tl.RecurrentTensor.placeholder((16,), domain=(t,), name="x")
        x[t.eq(0)] = u
        x[True] = x[t - 1] * 0.5 + u
        z = x[min_(t + 5, T - 1)] + u
        out = z[0:T].sum(0)
    prog = ctx.compile(bounds={T: 200}, outputs=[out])
    plan = _same_plan(prog, monkeypatch)
    prog.run()
    assert prog.stats()["peak_bytes"] == plan.peak_bytes


def test_a_burst_of_larger_temporaries_mid_loop_is_in_the_plan(monkeypatch):
    """For a middle third of a recurrence's points a branch makes a 16 KiB temporary the others
    do not: nothing the repeated iterations look at changes there, only the guard turns."""
    rng = np.random.default_rng(3)
    ctx = tl.Context(dims=("t",))
    (t,), (T,) = ctx.dims, ctx.bounds
    with ctx:
        u = tl.from_numpy(rng.standard_normal((300, 64)).astype(np.float32), domain=(t,))
        y = tl.RecurrentTensor.placeholder((64,), domain=(t,), name="y")
        y[t.eq(0)] = u
        burst = (y[t - 1].reshape(64, 1) * u.reshape(1, 64)).sum(1) * 0.01
        y[(t >= T // 3) & (t < 2 * (T // 3))] = burst
        y[True] = y[t - 1] * 0.5 + u
        out = y[0:T].sum(0)
    prog = ctx.compile(bounds={T: 300}, outputs=[out])
    plan = _same_plan(prog, monkeypatch)
    assert _applied(plan) > 200
    assert plan.peak_bytes >= 64 * 64 * 4  # the burst's temporary is counted
    prog.run()
    assert prog.stats()["peak_bytes"] == plan.peak_bytes


def test_random_programs_over_forty_points_plan_as_replayed(monkeypatch):
    """The differential fuzzer's programs (every construct: windows, clamps, prefixes, suffixes,
    piecewise branches, gradients), drawn with 40 points along ``t`` instead of 2 to 6 so
    that their loops are watched and repeated."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "fuzz"))
    from programs import FLAGS, RandomChooser, generate

    class Long(RandomChooser):
        """The generator's first draw of a size along ``t`` made 40."""

        def __init__(self, seed: int) -> None:
            super().__init__(seed)
            self.sized = False

        def int(self, lo: int, hi: int) -> int:
            if (lo, hi) == (2, 6) and not self.sized:
                self.sized = True
                return 40
            return super().int(lo, hi)

    repeated = 0
    for seed in range(60):
        program = generate(Long(seed), frozenset(FLAGS), grad=seed % 3 == 0)
        ctx, b, _ = program.build(tl)
        wanted = [b.tensors[t.name] for t in program.outputs]
        wanted += [b.tensors[t.name].grad for t in program.inputs] if program.grad else []
        prog = ctx.compile(bounds=program.bounds(b), outputs=wanted)
        repeated += _applied(_same_plan(prog, monkeypatch)) > 0
    assert repeated >= 40  # most of them had iterations applied, not replayed
