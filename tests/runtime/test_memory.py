"""Memory accounting with block stores: the meter counts a block once (its rows and the views
read from it are free), so a PPO rollout of large observations costs about its own size."""

from __future__ import annotations

import resource
import sys
from pathlib import Path

import numpy as np
import pytest
from core_helpers import counting

import timerl as tl
from timerl.ir import rowwise
from timerl.memory import replay as budget_pass
from timerl.memory import streams
from timerl.memory.replay import parse_bytes
from timerl.rl.algos import ppo
from timerl.runtime import heap

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # `bench` is a top-level directory, not an installed package
    sys.path.insert(0, str(ROOT))

from bench.swap import idle_block  # noqa: E402  (the swap benchmark's program)

STEPS = 512


def _synthetic_ppo(num_envs: int, num_steps: int, obs_shape: tuple[int, ...], **kwargs):
    """PPO over Synthetic-v0's episodes of 1,000 steps, with one hidden layer of 8."""
    return ppo(
        env_id="Synthetic-v0",
        num_envs=num_envs,
        num_steps=num_steps,
        hidden=(8,),
        env_kwargs={"obs_shape": obs_shape, "episode_length": 1000, "action_dim": 2},
        **kwargs,
    )


def _ppo(optimize: bool, backend: str = "numpy"):
    prog = _synthetic_ppo(4, STEPS, (3, 32, 32), epochs=1, minibatches=1)
    metrics = list(prog.metrics.values())
    c = prog.ctx.compile(
        bounds={"I": 2, **prog.bounds}, outputs=metrics, optimize=optimize, backend=backend
    )
    return c, metrics


def _held(store) -> int:
    """What a store keeps: its blocks (an alias's are another block's memory) or its points."""
    return len(store.blocks) if hasattr(store, "blocks") else len(store)


@pytest.mark.parametrize("compiled", [True, False], ids=["generated", "reference"])
def test_no_store_of_ppo_grows_with_the_iterations(compiled):
    """A training run does not leak: after 4 iterations every store that is not an output
    holds what it holds after 2 (the same program, compiled from one context)."""
    prog = _synthetic_ppo(2, 16, (3, 4, 4))
    metrics = list(prog.metrics.values())
    held = []
    for iterations in (2, 4):
        c = prog.ctx.compile(bounds={"I": iterations, **prog.bounds}, outputs=metrics)
        assert any(s.kind == "alias" for s in c.compiled.storage.values())
        c.run(compiled=compiled)
        stores = c._executor().stores
        held.append(
            {op.id: (op.label, _held(stores[op.id])) for op in c.ops if op.id not in c.keep}
        )
    # (constants folded at compile time are new ops in each program: compared by id, the rest)
    both = held[0].keys() & held[1].keys()
    assert len(both) > 0.9 * len(held[0])
    grown = {
        held[0][k][0]: (held[0][k][1], held[1][k][1]) for k in both if held[1][k][1] > held[0][k][1]
    }
    assert not grown, grown


@pytest.mark.parametrize("backend", ["numpy", "torch"])
def test_ppo_rollout_memory_is_one_rollout(backend):
    prog, metrics = _ppo(True, backend)
    obs = next(op for op in prog.ops if op.label == "obs")
    rollout = 4 * STEPS * 3 * 32 * 32 * np.dtype(obs.dtype).itemsize
    prog.run()
    peak = prog.stats()["peak_bytes"]
    ref, ref_metrics = _ppo(False)
    ref.run()
    ref_peak = ref.stats()["peak_bytes"]
    # the point-store reference holds the points and stacked copies of the slice reads
    assert ref_peak > 2 * rollout, (ref_peak, rollout)
    # one block, plus the small rest of the program (network, optimiser, activations)
    assert rollout <= peak <= 1.1 * rollout, (peak, rollout)
    for a, b in zip(
        [ref.value(m) for m in ref_metrics], [prog.value(m) for m in metrics], strict=True
    ):
        np.testing.assert_allclose(np.asarray(a, float), np.asarray(b, float), rtol=1e-4, atol=1e-5)


def test_generated_code_and_the_reference_account_the_same_bytes():
    peaks = []
    for compiled in (True, False):
        prog, _ = _ppo(True)
        prog.run(compiled=compiled)
        peaks.append(prog.stats()["peak_bytes"])
    assert peaks[0] == peaks[1]


@pytest.mark.parametrize("optimize", [True, False], ids=["blocks", "points"])
def test_planned_peak_is_the_measured_peak(optimize):
    prog, _ = _ppo(optimize)
    planned = prog.planned_peak()
    prog.run()
    assert planned.peak_bytes == prog.stats()["peak_bytes"]
    if optimize:
        assert planned.holders[0][0] == "obs"


def test_the_heaps_share_of_the_planned_peak_leaves_out_arrays_mapped_apart():
    prog, _ = _ppo(True)
    spec = prog.compiled.spec
    donations = prog.backend.donations(prog.compiled.donations, prog.ops)

    def plan(small: int) -> budget_pass.PlannedPeak:
        return budget_pass.planned_peak(
            prog.schedule,
            prog.ops,
            prog.compiled.storage,
            spec.static,
            spec.dynamic,
            donations,
            small=small,
        )

    whole = plan(1 << 40)
    obs = dict(whole.holders)["obs"]  # the largest array, the rollout's block
    apart = plan(obs - 1)
    assert whole.peak_small_bytes == whole.peak_bytes
    assert plan(0).peak_small_bytes == 0
    assert whole.peak_bytes - obs <= apart.peak_small_bytes < whole.peak_bytes


def test_a_run_faults_in_the_heaps_share_of_its_peak_at_setup():
    prog, _ = _ppo(True)
    ex = prog.executor()
    assert ex.heap_reserve == prog.planned_peak().peak_small_bytes > 0
    ex.prepare()
    assert ex._reserved == ex.heap_reserve or heap._glibc() is None
    # under a budget freed pages go back at once: nothing is reserved
    prog.memory_budget = prog.planned_peak().peak_bytes
    assert prog.executor().heap_reserve == 0


def test_nothing_is_reserved_where_the_user_configured_the_heap(monkeypatch):
    from timerl.runtime import executor

    monkeypatch.setenv("MALLOC_TRIM_THRESHOLD_", "131072")
    monkeypatch.setattr(heap, "_KEEPING", [None])
    trims = []
    monkeypatch.setattr(executor, "release_free_heap", lambda: trims.append(1))
    prog, _ = _ppo(True)
    ex = prog.executor()
    ex.prepare()
    # and what compiling freed goes back, as where nothing is reserved
    assert ex.heap_reserve > 0 and ex._reserved == 0 and trims == [1]


def test_nothing_is_reserved_where_arrays_mapped_apart_hold_most_of_the_peak():
    # a rollout of images above the mmap threshold: its faults are not the heap's
    prog = _synthetic_ppo(4, 1000, (3, 64, 64))
    compiled = prog.ctx.compile(bounds={"I": 2, **prog.bounds})
    plan = compiled.planned_peak()
    assert 0 < 2 * plan.peak_small_bytes < plan.peak_bytes
    assert compiled.executor().heap_reserve == 0


def test_a_run_mapping_its_arrays_apart_still_reuses_pages_for_each_steps_arrays(monkeypatch):
    # the env's observations (4 envs x 3x64x64 floats) come anew at each of the 1,000 steps:
    # their size still comes from the heap's pages, the rollout's block and the update's
    # arrays (over 4,000 rows) are mapped apart
    prog = _synthetic_ppo(4, 1000, (3, 64, 64), minibatches=1)
    compiled = prog.ctx.compile(bounds={"I": 2, **prog.bounds})
    ex = compiled.executor()
    assert not ex.keep_freed_pages
    assert ex.reuse_up_to == budget_pass.repeated_array_bytes(compiled.schedule, compiled.static)
    assert ex.reuse_up_to == 4 * 3 * 64 * 64 * 4
    # not where the heap would keep more than a sixteenth of the peak for them
    from timerl.memory import heap_policy

    peak = compiled.planned_peak().peak_bytes
    monkeypatch.setattr(heap_policy, "REUSE_SHARE", peak // (4 * ex.reuse_up_to) + 1)
    assert compiled.executor().reuse_up_to == 0
    monkeypatch.undo()
    # a heap that keeps its pages needs no such size; under a budget the steps' arrays are
    # mapped apart too (faults, not memory)
    assert _ppo(True)[0].executor().reuse_up_to == 0
    compiled.memory_budget = compiled.planned_peak().peak_bytes
    assert compiled.executor().reuse_up_to == 0


def test_repeated_arrays_are_those_of_loops_run_many_times_an_iteration():
    from timerl.ir.graph import Op
    from timerl.schedule.program import Compute, Loop, Schedule
    from timerl.symbolic import Const, Dim

    def op(shape):
        return Op("const", (), tuple(Const(n) for n in shape), np.dtype(np.float32))

    i, t, u = Dim("i"), Dim("t"), Dim("u")
    step, update, once = op((8, 100)), op((4000, 64)), op((1 << 20,))
    sched = Schedule(
        [
            Loop(
                i,
                True,
                [
                    Compute(once),
                    Loop(t, True, [Compute(step)]),
                    Loop(u, True, [Compute(update)]),
                ],
            )
        ]
    )
    static = {i.bound: 3, t.bound: 1000, u.bound: 4}
    assert budget_pass.repeated_array_bytes(sched, static) == 8 * 100 * 4
    static[u.bound] = 16  # a minibatch loop of 16 points repeats its arrays too
    assert budget_pass.repeated_array_bytes(sched, static) == 4000 * 64 * 4
    assert budget_pass.repeated_array_bytes(Schedule([Compute(once)]), static) == 0


def test_a_run_whose_peak_is_mostly_arrays_mapped_apart_keeps_no_freed_pages(monkeypatch):
    # the holes freed arrays leave in a heap that keeps its pages stay resident, unseen by the
    # meter, and such a heap serves little of this run: it gives them back, before the plan's
    # peak too, while the rollout's block still keeps its rows from one iteration to the next
    from timerl.api import program as program_module

    ref, ref_metrics = _ppo(True)
    assert ref.executor().keep_freed_pages and not ref.executor().trim_before
    ref.run()
    monkeypatch.setattr(program_module, "MMAP_THRESHOLD", 1 << 20)  # the obs block: 6 MiB
    prog, metrics = _ppo(True)
    plan = prog.planned_peak()
    assert 0 < 2 * plan.peak_small_bytes < plan.peak_bytes
    ex = prog.executor()
    assert not ex.keep_freed_pages and ex.heap_reserve == 0
    assert ex.trim_before == {plan.peak_op} and ex._spares
    # set again by the run, not restored after it: restored, the state would say what glibc's
    # heap was before the run, not what it is (a later test would then skip setting it)
    heap._KEEPING[0] = None
    trims: list[int] = []
    monkeypatch.setattr(heap, "release_free_heap", lambda: trims.append(1))
    monkeypatch.setattr(heap, "_LAST_TRIM", [0.0, 0.0])
    prog.run()
    assert heap._KEEPING == [False] or heap._glibc() is None
    assert trims
    for a, b in zip(
        [ref.value(m) for m in ref_metrics], [prog.value(m) for m in metrics], strict=True
    ):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_a_run_whose_pages_were_reserved_at_setup_hardly_faults():
    if heap._glibc() is None:
        pytest.skip("glibc's heap only")
    prog, _ = _ppo(True)
    pages = prog.planned_peak().peak_small_bytes // 4096
    faults = []
    for reserve in (True, False):
        ex = prog.executor()
        if not reserve:
            ex.heap_reserve = 0
            heap.release_free_heap()  # what the reserved run left in the heap goes back
        ex.prepare()
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        ex.run()
        faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
    # 6,400 pages planned: 200-1,000 faults reserved (more in a process that ran other tests),
    # 3,600 not (huge pages where numpy asks for them)
    assert faults[0] * 2 < faults[1] and faults[1] > pages // 4


def test_a_run_that_reserves_no_pages_compiles_its_code_apart(monkeypatch):
    # apart, Python's compiler leaves its freed blocks out of the heap the run allocates
    # from; a run whose pages are reserved fills those holes instead (heap.compile_apart)
    from timerl.runtime import codegen

    apart: list[str] = []

    def spy(source: str, filename: str):
        apart.append(filename)
        return compile(source, filename, "exec")

    monkeypatch.setattr(codegen, "compile_apart", spy)
    prog, _ = _ppo(True)
    reserved = prog.executor()
    reserved.prepare()
    assert bool(apart) == (not reserved._reserved)
    prog.memory_budget = prog.planned_peak().peak_bytes  # under a budget nothing is reserved
    lean = prog.executor()
    before = len(apart)
    lean.prepare()
    assert lean.heap_reserve == 0 and len(apart) == before + 1


def test_a_budget_below_the_peak_is_refused_at_compile_time():
    prog = _synthetic_ppo(4, STEPS, (3, 32, 32))
    bounds = {"I": 2, **prog.bounds}
    need = prog.ctx.compile(bounds=bounds).planned_peak().peak_bytes
    assert need is not None
    with pytest.raises(tl.MemoryBudgetError) as err:
        prog.ctx.compile(bounds=bounds, memory_budget="64KiB")
    msg = str(err.value)
    smallest = int(msg.split("memory_budget=")[1].split(".")[0])
    # the rollout streamed to disk (its readers read it by rows) lowers the smallest budget, by
    # the rollout less the chunk its readers read it into (at the smallest, 1 MiB)
    chunk = rowwise.CHUNK_BYTES >> streams.SHRINK
    assert smallest <= need - 4 * STEPS * 3 * 32 * 32 * 4 + chunk
    fits = prog.ctx.compile(bounds=bounds, memory_budget=smallest)
    assert fits.stats()["planned_peak_bytes"] == smallest
    assert "streamed to disk" in fits.explain()
    prog.ctx.compile(bounds=bounds, memory_budget="1GiB")


def test_a_budget_is_bytes_or_a_size_string():
    assert parse_bytes(4096) == 4096
    assert parse_bytes("256MiB") == 256 * 2**20
    assert parse_bytes("1.5 GB") == 1_500_000_000
    assert parse_bytes("64k") == 64 * 1024
    for bad in ("lots", "12 parsecs", 0, -5, "0MiB"):
        with pytest.raises(tl.MemoryBudgetError, match="memory budget"):
            parse_bytes(bad)


def test_train_refuses_a_budget_too_small_before_training(capsys):
    from timerl.cli import main

    argv = ["train", "reinforce", "--env", "CartPole-v1", "--steps", "64", "--num-envs", "2"]
    code = main([*argv, "--num-steps", "32", "--memory-budget", "1KiB", "--no-progress"])
    err = capsys.readouterr().err
    assert code != 0 and "memory budget of 1.0 KiB" in err and "memory_budget=" in err
    assert main([*argv, "--num-steps", "32", "--memory-budget", "512MiB", "--no-progress"]) == 0


def test_planned_peak_of_a_plain_recurrence_is_the_measured_peak():
    """One loop over t holding every point (outputs are kept): not cut short like a training
    loop (its repeated iterations may be applied rather than replayed, exactly)."""
    ctx = tl.Context(dims=("t",))
    (t,), (T,) = ctx.dims, ctx.bounds
    with ctx:
        x = tl.RecurrentTensor.placeholder(shape=(64,), domain=(t,))
        x[0] = tl.zeros((64,))
        x[t + 1] = x[t] * 0.5 + 1.0
        ret = tl.RecurrentTensor.placeholder(shape=(64,), domain=(t,))
        ret[t.eq(T - 1)] = x
        ret[True] = x + 0.9 * ret[t + 1]
        prefix = x[0 : t + 1].mean(0)
    prog = ctx.compile(bounds={T: 40}, outputs=[ret, prefix])
    planned = prog.planned_peak()
    prog.run()
    assert planned.peak_bytes == prog.stats()["peak_bytes"]
    assert "no longer change" not in planned.note


def _cuda() -> list[tuple[str, str]]:
    """("torch", "cuda") where a CUDA device exists: the host-memory tier for real."""
    try:
        import torch
    except ImportError:
        return []
    return [("torch", "cuda")] if torch.cuda.is_available() else []


@pytest.mark.parametrize("backend, device", [("numpy", "cpu"), ("torch", "cpu"), *_cuda()])
@pytest.mark.parametrize("compiled", [True, False], ids=["generated", "reference"])
def test_an_idle_block_is_swapped_to_the_next_tier_under_a_budget(backend, device, compiled):
    block = 100 * 1024 * 4
    ctx, out = idle_block()
    kw = {"bounds": {"T": 100}, "outputs": [out], "backend": backend, "device": device}
    free = ctx.compile(**kw)
    free.run(compiled=compiled)
    assert free.stats()["peak_bytes"] > 2 * block  # both blocks live while y is written
    budget = int(1.5 * block)
    prog = ctx.compile(**kw, memory_budget=budget)
    assert "swap out" in prog.schedule.dump() and "swap:" in prog.explain()
    prog.run(compiled=compiled)
    stats = prog.stats()
    assert stats["peak_bytes"] <= budget and stats["peak_bytes"] == stats["planned_peak_bytes"]
    assert stats["swapped_bytes"] == 2 * block  # written once, read back once
    assert stats["swap_tier"] == ("host" if device == "cuda" else "disk")
    assert stats["swap_tier_peak_bytes"] == block  # x, while y's loop runs
    np.testing.assert_array_equal(prog.value(out), free.value(out))


@pytest.mark.parametrize("compiled", [True, False], ids=["generated", "reference"])
def test_a_swapped_block_really_leaves_memory(compiled):
    """numpy's allocations as tracemalloc sees them peak where the meter does: the swap
    copies no block on its way to disk or back, and no reference keeps a swapped block."""
    import tracemalloc

    block = 64 * 16384 * 4  # 4 MiB: far above the few objects a run makes
    ctx, out = idle_block(16384)
    prog = ctx.compile(bounds={"T": 64}, outputs=[out], memory_budget=int(1.5 * block))
    prog.run(compiled=compiled)  # the code is generated on the first run
    tracemalloc.start()
    try:
        prog.run(compiled=compiled)
        traced = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    metered = prog.stats()["peak_bytes"]
    assert prog.stats()["swapped_bytes"] == 2 * block
    assert metered <= traced < metered + block // 16


@pytest.mark.parametrize("compiled", [True, False], ids=["generated", "reference"])
def test_a_host_tier_swaps_to_memory_and_writes_no_file(monkeypatch, compiled):
    """The host-memory tier of an accelerator, run on the CPU: same values, no file."""
    from timerl.runtime import stores

    def no_file(*args, **kwargs):
        raise AssertionError("the host tier wrote a file")

    monkeypatch.setattr(stores.tempfile, "mkstemp", no_file)
    block = 100 * 1024 * 4
    ctx, out = idle_block()
    kw = {"bounds": {"T": 100}, "outputs": [out], "backend": "torch"}
    free = ctx.compile(**kw)
    free.run(compiled=compiled)
    prog = ctx.compile(**kw, memory_budget=int(1.5 * block))
    prog.backend.swap_tier = "host"
    prog.run(compiled=compiled)
    stats = prog.stats()
    assert stats["swap_tier"] == "host" and stats["swapped_bytes"] == 2 * block
    assert stats["swap_tier_peak_bytes"] == block
    assert stats["peak_bytes"] == stats["planned_peak_bytes"]
    np.testing.assert_array_equal(prog.value(out), free.value(out))


def test_a_budget_swapping_cannot_meet_names_the_smallest_that_fits():
    ctx, out = idle_block()
    with pytest.raises(tl.MemoryBudgetError) as err:
        ctx.compile(bounds={"T": 100}, outputs=[out], memory_budget=100_000)
    fits = int(str(err.value).split("memory_budget=")[1].split(".")[0])
    prog = ctx.compile(bounds={"T": 100}, outputs=[out], memory_budget=fits)
    prog.run()
    assert prog.stats()["peak_bytes"] == fits


def test_the_planned_peak_names_the_op_that_reaches_it():
    """``wide`` writes into ``base``'s buffer (its last reader), so the peak is where ``base``
    is computed beside the 4 KiB of ones it broadcasts, and explain() and the budget error
    say so."""
    ctx, t, T, x = counting(16)
    with ctx:
        base = (x[t].reshape((16, 1)) * tl.ones((1, 1024))).named("base")
        wide = (base * 2.0).named("wide")
        small = wide.sum(1).named("small")
    prog = ctx.compile(bounds={T: 3}, outputs=[small])
    planned = prog.planned_peak()
    assert planned.peak_at == "base" and planned.holders[0] == ("base", 64 * 1024)
    assert "wide" not in {name for name, _ in planned.holders}
    assert "reached computing base" in prog.explain()
    with pytest.raises(tl.MemoryBudgetError, match="The peak is reached computing base"):
        ctx.compile(bounds={T: 3}, outputs=[small], memory_budget=1024)


def _plan(prog, small: int) -> budget_pass.PlannedPeak:
    spec = prog.compiled.spec
    donations = prog.backend.donations(prog.compiled.donations, prog.ops)
    return budget_pass.planned_peak(
        prog.schedule, prog.ops, prog.compiled.storage, spec.static, spec.dynamic, donations, small
    )


def test_a_rollouts_block_mapped_apart_may_keep_its_rows_for_the_next_iteration():
    prog, _ = _ppo(True)
    obs = next(op for op in prog.ops if op.label == "obs")
    rows = dict(_plan(prog, 1 << 40).holders)["obs"]
    # nothing big is live while the rollout's block is dead: keeping its rows raises nothing
    assert _plan(prog, rows - 1).spare_blocks == {obs.id}
    assert _plan(prog, 1 << 40).spare_blocks == frozenset()  # no block is mapped apart


def test_no_block_keeps_its_rows_where_that_would_raise_the_peak():
    # two blocks over t, one after the other in each iteration: either one's rows kept while
    # the other is live would hold both at once, above the peak of either
    ctx = tl.Context(dims=("i", "t"))
    (i, t), (I, T) = ctx.dims, ctx.bounds
    with ctx:
        a = tl.RecurrentTensor.placeholder(shape=(1024,), domain=(i, t))
        a[i, 0] = tl.zeros((1024,)) + i
        a[i, t + 1] = a[i, t] * 0.5 + 1.0
        b = tl.RecurrentTensor.placeholder(shape=(4096,), domain=(i, t))
        b[i, 0] = tl.zeros((4096,)) + a[i, 0:T].sum()
        b[i, t + 1] = b[i, t] * 0.5 + 1.0
        out = b[i, 0:T].sum(0)
    prog = ctx.compile(bounds={I: 3, T: 64}, outputs=[out])
    blocks = [i for i, s in prog.compiled.storage.items() if s.kind == "block"]
    assert len(blocks) == 2
    assert _plan(prog, 1024).spare_blocks == frozenset()


@pytest.mark.parametrize("backend", ["numpy", "torch"])
def test_a_block_reusing_its_rows_reads_none_before_writing_them(monkeypatch, backend):
    """A reused block holds the last iteration's rows: poisoned as it is reused, every value
    is still the reference's (a row read before it is written would show NaN)."""
    from timerl.api import program as program_module
    from timerl.runtime.stores import BlockStore

    reused = []
    fresh_rows = BlockStore._new_rows

    def poisoned(self):
        spare = id(self.spare[0]) if self.spare else None  # (a reference would keep it)
        rows = fresh_rows(self)
        base = rows if type(rows) is np.ndarray else self.bases.get(id(rows))
        if base is not None and id(base) == spare:
            reused.append(base.nbytes)
            base[...] = np.nan
        return rows

    pytest.importorskip(backend)
    monkeypatch.setattr(BlockStore, "_new_rows", poisoned)
    ref, ref_metrics = _ppo(True, backend)
    ref.run()
    monkeypatch.setattr(program_module, "MMAP_THRESHOLD", 1 << 20)  # the obs block: 6 MiB
    prog, metrics = _ppo(True, backend)
    prog.run()
    rollout = 4 * STEPS * 3 * 32 * 32 * 4
    # the first iteration's block is the spare made at setup, the second's the first's rows
    assert reused == [rollout, rollout]
    for a, b in zip(
        [ref.value(m) for m in ref_metrics], [prog.value(m) for m in metrics], strict=True
    ):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    assert "kept between iterations (blocks mapped apart, within the peak): obs" in prog.explain()
    # rows no block holds go back when the run ends, and nothing is kept under a budget
    assert prog._executor()._spares and not prog._executor()._spares[0].spare
    prog.memory_budget = prog.planned_peak().peak_bytes
    assert not prog.executor()._spares


def test_numpys_huge_page_advice_is_off_while_a_run_maps_arrays_apart(monkeypatch):
    # a fresh mapping's huge pages can wait on the kernel compacting memory (heap.py)
    from timerl.api import program as program_module

    before = heap.numpy_huge_pages(True)
    if before is None:
        pytest.skip("numpy offers no huge-page switch")
    settings = []
    switch = heap.numpy_huge_pages

    def spy(enabled: bool):
        settings.append(enabled)
        return switch(enabled)

    monkeypatch.setattr(heap, "numpy_huge_pages", spy)
    prog, _ = _ppo(True)
    prog.run()
    assert settings == []  # no array is mapped apart: numpy's advice stays
    monkeypatch.setattr(program_module, "MMAP_THRESHOLD", 1 << 20)
    prog, _ = _ppo(True)
    prog.run()
    # off for the run (and for faulting the spare rows in, inside it), then set back
    assert len(settings) >= 2 and settings[-1] is True and not any(settings[:-1])
    assert switch(before) is True
