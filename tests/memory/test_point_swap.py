"""Optimiser moments go to disk between updates and gradients while they wait for the optimiser,
under a memory budget and, from 1 MiB up, without one: same values, less held."""

from __future__ import annotations

import numpy as np
import pytest

from timerl.memory.point_swap import plan_point_swaps
from timerl.rl.algos import ppo
from timerl.rl.train import train
from timerl.schedule.program import Compute, SwapIn, SwapOut

# first-layer weights of 768 x 64 float32: 192 KiB a moment, above the smallest swapped
CONFIG = {
    "env_id": "Synthetic-v0",
    "env_kwargs": {"obs_shape": (3, 16, 16), "episode_length": 40, "action_dim": 2},
    "num_envs": 2,
    "num_steps": 32,
    "epochs": 2,
    "minibatches": 2,
    "hidden": (64,),
    "seed": 5,
}


# first-layer weights of 3,072 x 96 float32: 1.1 MiB a moment, as large as a run without a
# budget moves
LARGE = {
    **CONFIG,
    "env_kwargs": {"obs_shape": (3, 32, 32), "episode_length": 40, "action_dim": 2},
    "hidden": (96,),
}


def _ppo(config=CONFIG):
    kwargs = {k: v for k, v in config.items() if k != "seed"}
    algo = ppo(**kwargs)
    return algo, {"I": 3, **algo.bounds}


def test_moments_and_idle_gradients_swap_to_disk_with_the_same_values_and_a_lower_peak():
    algo, bounds = _ppo()
    metrics = list(algo.metrics.values())
    free = algo.ctx.compile(bounds=bounds, outputs=metrics, seed=1)
    need = free.planned_peak().peak_bytes
    algo2, _ = _ppo()
    swapped = list(algo2.metrics.values())
    # a budget the plan meets without swapping: the state still goes where that lowers it
    prog = algo2.ctx.compile(bounds=bounds, outputs=swapped, seed=1, memory_budget=need)
    text = prog.explain()
    assert "swap: adam_m(actor.0.weight@u) to disk between updates" in text
    assert "swap: adam_v(critic.0.weight@u) to disk between updates" in text
    assert "to disk while it is idle" in text  # a first layer's gradient, until the clipping
    outs = [s for s in prog.compiled.schedule.statements() if isinstance(s, SwapOut)]
    assert outs and all(s.points for s in outs)
    free.run()
    prog.run()
    stats = prog.stats()
    # the run's meter counts the swaps as the plan does, and the plan is lower
    assert stats["peak_bytes"] == stats["planned_peak_bytes"] < free.stats()["peak_bytes"]
    assert stats["swapped_bytes"] > 0 and stats["swap_tier"] == "disk"
    for m, m2 in zip(metrics, swapped, strict=True):
        np.testing.assert_allclose(prog.value(m2), free.value(m), rtol=1e-5, atol=1e-6)


def test_every_reader_of_a_swapped_value_reads_it_back_first():
    """Replayed by hand: along the schedule, a value sent out is read only after a swap-in
    of the point it reads (or not at all)."""
    algo, bounds = _ppo()
    prog = algo.ctx.compile(bounds=bounds, seed=1, memory_budget=1 << 40)
    sched = prog.compiled.schedule
    out_ops = {s.op.id for s in sched.statements() if isinstance(s, SwapOut)}
    assert out_ops
    # each swapped op is swapped in before its readers in every body that reads it
    for body in [sched.body] + [s.body for s in sched.loops()]:
        gone: set[int] = set()
        for s in body:
            if isinstance(s, SwapOut):
                gone.add(s.op.id)
            elif isinstance(s, SwapIn):
                gone.discard(s.op.id)
            elif isinstance(s, Compute):
                assert not any(e.src.id in gone for e in s.op.inputs), s.op.label


def test_without_a_budget_values_under_a_mebibyte_stay_and_the_pass_never_raises_the_plan():
    algo, bounds = _ppo()
    prog = algo.ctx.compile(bounds=bounds, seed=1)
    plan = prog.planned_peak()
    c = prog.compiled
    assert not any(isinstance(s, SwapOut) for s in c.schedule.statements())
    same, again, notes = plan_point_swaps(
        c.schedule, list(c.spec.ops), c.storage, c.spec.static, c.spec.dynamic, c.donations
    )
    # swaps are tried and kept only where they lower the peak; the plan is never higher
    assert again.peak_bytes <= plan.peak_bytes
    assert bool(notes) == (same is not c.schedule)


def test_without_a_budget_moments_of_a_mebibyte_go_to_disk_where_that_lowers_the_peak(
    monkeypatch,
):
    """The unoptimised program is the reference, value for value; the same compile without
    the moves (their smallest size out of reach) plans a higher peak."""
    import timerl.memory.plan as memory_plan

    algo, bounds = _ppo(LARGE)
    prog = algo.ctx.compile(bounds=bounds, seed=1, outputs=list(algo.metrics.values()))
    assert "0.weight@u) to disk between updates (1.1 MiB)" in prog.explain()  # a moment
    ref, _ = _ppo(LARGE)
    reference = ref.ctx.compile(
        bounds=bounds, seed=1, outputs=list(ref.metrics.values()), optimize=False
    )
    monkeypatch.setattr(memory_plan, "UNBUDGETED_SWAP_MIN_BYTES", 1 << 62)
    held, _ = _ppo(LARGE)
    kept = held.ctx.compile(bounds=bounds, seed=1, outputs=list(held.metrics.values()))
    assert not any(isinstance(s, SwapOut) for s in kept.compiled.schedule.statements())
    assert prog.planned_peak().peak_bytes < kept.planned_peak().peak_bytes
    prog.run()
    reference.run()
    stats = prog.stats()
    assert stats["swapped_bytes"] > 0 and stats["swap_tier"] == "disk"
    assert stats["peak_bytes"] == prog.planned_peak().peak_bytes  # the run's meter agrees
    for name, t in algo.metrics.items():
        want = reference.value(ref.metrics[name])
        np.testing.assert_allclose(prog.value(t), want, rtol=1e-5, atol=1e-6, err_msg=name)


def test_without_a_budget_the_moves_of_a_long_run_are_those_of_its_first_iterations(
    monkeypatch,
):
    """The search replays the first iterations of the training loop only (a replay walks
    every iteration of a loop that holds a swap), and a run of 200 iterations moves what a
    run of 3 moves."""
    import timerl.memory.point_swap as point_swap

    replayed = []
    replay = point_swap.planned_peak

    def counting(sched, ops, storage, static, *args, **kwargs):
        replayed.extend(n for b, n in static.items() if b.name == "I")
        return replay(sched, ops, storage, static, *args, **kwargs)

    monkeypatch.setattr(point_swap, "planned_peak", counting)

    def swaps(iterations):
        algo, bounds = _ppo(LARGE)
        bounds["I"] = iterations
        prog = algo.ctx.compile(bounds=bounds, seed=1, outputs=list(algo.metrics.values()))
        return [n for n in prog.report.notes if n.startswith("swap:")]

    short = swaps(3)
    assert short and swaps(200) == short
    assert replayed and set(replayed) == {3}


@pytest.mark.parametrize(
    ("config", "budget"), [(CONFIG, "1GiB"), (LARGE, None)], ids=["budget", "no-budget"]
)
def test_a_run_resumes_with_its_moments_from_disk(tmp_path, config, budget):
    """The checkpoint after an iteration holds the moments that are on disk then."""
    stop_at = 2

    class _Stop(Exception):
        pass

    def stop(rec):
        if rec["iteration"] + 1 == stop_at:
            raise _Stop

    def run(name, **kw):
        return train(
            "ppo",
            kw.pop("config", dict(config)),
            iterations=4,
            memory_budget=budget,
            log_dir=tmp_path / name,
            checkpoint_every=1,
            progress=False,
            echo=lambda line: None,
            **kw,
        )

    full = run("a")
    assert full.swapped_bytes > 0
    with pytest.raises(_Stop):
        run("b", on_iteration=stop)
    resumed = run("b", config=None, resume=True)
    np.testing.assert_array_equal(resumed.returns, full.returns)


def test_the_order_model_counts_swapped_state_from_its_merge_to_its_last_reader():
    """With ``state_on_disk`` a large carried merge is a source of its own bytes placed where
    the order puts it (read back from disk there), and the next update's value is no output
    of the block (sent to disk after its last reader); without it, the merge shares an input
    held from the block's start and the next value is held to the block's end."""
    from timerl.api.program import VALIDATION_SIZE
    from timerl.ir.graph import consumers
    from timerl.schedule.to_graph import block_graph, loop_blocks

    algo, bounds = _ppo()
    prog = algo.ctx.compile(bounds=bounds, seed=1)
    sizes = dict(prog.static)
    sizes.update({b: c if c is not None else VALIDATION_SIZE for b, c in prog.dynamic.items()})
    readers = consumers(prog.ops)
    seen = 0
    for block in loop_blocks(prog.schedule.body):
        merge = next((op for op in block.ops if op.label == "adam_m(actor.0.weight@u)"), None)
        if merge is None:
            continue
        new_m = next(r for r, _ in readers[merge.id] if r.prim == "mul").id  # beta1 * m
        nxt = next(r for r, _ in readers[new_m] if r.prim == "add")  # m' = beta1 m + ...
        for on_disk in (False, True):
            g, op_of = block_graph(
                block,
                sizes,
                readers,
                set(prog.keep),
                strict_reads=True,
                resident_inputs=True,
                state_on_disk=on_disk,
            )
            node = {op.id: v for v, op in ((g.index[n], op) for n, op in op_of.items())}
            m, m_next = node[merge.id], node[nxt.id]
            if on_disk:
                assert g.alias[m] < 0 and g.nodes[m].bytes == 192 * 1024
                assert not g.nodes[m_next].output
            else:
                assert g.nodes[g.alias[m]].op == "input"
                assert g.nodes[m_next].output
        seen += 1
    assert seen == 1


def test_a_budget_leaves_the_first_iteration_reuse_out():
    """Reuse keeps the rollout's activations for the first update, held through its backward
    pass beside the update's own: a compile for a budget recomputes them instead."""
    kwargs = {k: v for k, v in CONFIG.items() if k != "seed"}
    kwargs.update(epochs=1, minibatches=1)
    free, budgeted = ppo(**kwargs), ppo(**kwargs)
    bounds = {"I": 2, **free.bounds}
    free_prog = free.ctx.compile(bounds=bounds, seed=1)
    budget_prog = budgeted.ctx.compile(bounds=bounds, seed=1, memory_budget="1GiB")
    assert "reused" in free_prog.explain()
    assert "reused" not in budget_prog.explain()
    assert budget_prog.planned_peak().peak_bytes < free_prog.planned_peak().peak_bytes
