"""The compiler: ``compile(spec, options, capabilities) -> Compiled``, the passes of ``PASSES``
run top to bottom over one frozen ``CompileState``.

Every pass maps a state to a new one: a rewritten spec (never changing the ops it was given,
so programs compiled from one context are independent values), or the schedule and memory plan
made from it. A pass applies where its ``when`` says so for the compile's ``CompileOptions``;
what the backend can do is asked of its ``Capabilities``, never of its name. Each pass is timed
for ``prog.explain()``, and leaves its notes there.

Under a memory budget the budget search fits the program: swaps, streams and state sent to disk
(``memory/plan.py``), and where those leave it over the budget, computations over many rows
run in blocks of rows. That last move rewrites the program, so the passes from
incrementalisation on run again, from the state they started from, once per block count
tried: the passes before it are not repeated.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import math
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

from timerl.compiler.branches import drop_empty_branches
from timerl.compiler.cse import merge_duplicates
from timerl.compiler.dce import eliminate_dead_code
from timerl.compiler.fusion import plan_fusion
from timerl.compiler.guards import add_guards
from timerl.compiler.hoist import hoist_invariants
from timerl.compiler.incrementalize import incrementalize
from timerl.compiler.options import CompileOptions
from timerl.compiler.order import order_blocks
from timerl.compiler.ragged import spread_ragged_bounds
from timerl.compiler.reuse import reuse_first_iteration
from timerl.compiler.scan import scan_recurrences
from timerl.compiler.simplify import simplify
from timerl.compiler.spec import ProgramSpec
from timerl.compiler.unread import warn_unread_last_rows
from timerl.compiler.vectorize import vectorize
from timerl.ir.validate import check_bounds, check_not_empty, validate
from timerl.memory.budget import check_budget
from timerl.memory.plan import Capabilities, MemoryPlan, plan_memory
from timerl.memory.plan import Program as MemoryProgram
from timerl.memory.replay import PlannedPeak
from timerl.memory.storage import Storage
from timerl.schedule.fused import FusedSchedule
from timerl.schedule.overlap import overlap_host_calls
from timerl.schedule.program import Schedule
from timerl.schedule.scheduler import schedule_program

T = TypeVar("T")

BLOCK_COUNTS = (4, 16, 64)  # block counts a budget tries, fewest first
BUDGET_SEARCH = "memory budget search"  # the pass that runs the passes before it again


@dataclass
class CompileReport:
    """What ``explain()`` shows of compiling: each pass's time, and the notes passes left."""

    timings: list[tuple[str, float]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def timed(self, name: str, fn: Callable[[], T]) -> T:
        start = time.perf_counter()
        out = fn()
        self.timings.append((name, time.perf_counter() - start))
        return out

    def copy(self) -> CompileReport:
        return CompileReport(list(self.timings), list(self.notes))


@dataclass(frozen=True)
class CompileState:
    """What the passes hand on: the program, how to compile it, and what is decided so far.

    ``report`` is the one growing log of the compile (timings and notes); ``resume`` holds,
    under a memory budget only, the state incrementalisation starts from, for the budget's
    search over block counts."""

    spec: ProgramSpec
    options: CompileOptions
    capabilities: Capabilities
    report: CompileReport
    schedule: Schedule | None = None
    memory: MemoryPlan = MemoryPlan()
    # the statements as the backend runs them (regions, fused loops and iterations)
    fused: FusedSchedule | None = None
    resume: CompileState | None = None

    def note(self, *lines: str) -> CompileState:
        self.report.notes.extend(lines)
        return self

    def with_spec(self, spec: ProgramSpec) -> CompileState:
        return dataclasses.replace(self, spec=spec)

    @property
    def memory_program(self) -> MemoryProgram:
        spec = self.spec
        return MemoryProgram(list(spec.ops), spec.static, spec.dynamic, spec.keep)


@dataclass(frozen=True)
class Pass:
    """One step of the pipeline: ``run`` maps a state to the next, where ``when`` holds."""

    name: str
    run: Callable[[CompileState], CompileState]
    when: Callable[[CompileState], bool] = lambda state: True
    rewrites: bool = True  # a pass over the graph (before scheduling), else over the schedule
    timed: bool = True  # passes that time their own steps are not timed as a whole


@dataclass(frozen=True)
class Compiled:
    """The compiled program: its final graph, schedule (with memory statements), memory plan
    and report."""

    spec: ProgramSpec
    schedule: Schedule
    report: CompileReport
    memory: MemoryPlan = MemoryPlan()
    options: CompileOptions = CompileOptions()
    # the statements as the backend runs them: regions, fused loops and iterations
    # (``compiler/fusion.py``, given the backend's capabilities)
    fused: FusedSchedule | None = None

    @property
    def storage(self) -> Mapping[int, Storage]:
        """Op id -> storage (an op missing here is a point store)."""
        return self.memory.storage

    @property
    def donations(self) -> Mapping[int, int]:
        """Op id -> the input position whose dead buffer it writes into."""
        return self.memory.donations

    @property
    def planned(self) -> PlannedPeak | None:
        """The planned peak a memory budget made (None without a budget)."""
        return self.memory.planned


# --- the passes, in order ------------------------------------------------------------------------


def _spec_pass(
    fn: Callable[[ProgramSpec], ProgramSpec], removed: str = ""
) -> Callable[[CompileState], CompileState]:
    """A pass that rewrites the spec; ``removed`` notes how many ops it took out."""

    def run(state: CompileState) -> CompileState:
        spec = fn(state.spec)
        dropped = len(state.spec.ops) - len(spec.ops)
        out = state.with_spec(spec)
        return out.note(f"{dropped} {removed}") if removed and dropped else out

    return run


def _noting_pass(
    fn: Callable[[ProgramSpec, list[str]], ProgramSpec],
) -> Callable[[CompileState], CompileState]:
    """A pass that rewrites the spec and says what it did in the report's notes."""
    return lambda state: state.with_spec(fn(state.spec, state.report.notes))


def _dead_code(state: CompileState) -> CompileState:
    out = _spec_pass(eliminate_dead_code, "dead ops removed")(state)
    check_not_empty(list(out.spec.ops))
    return out


def _unread_rows(state: CompileState) -> CompileState:
    return state.note(*warn_unread_last_rows(state.spec))  # x's last row never read


def _bounds(state: CompileState) -> CompileState:
    # before any pass sizes a dim: a bound left out is the user's error, named as such
    check_bounds(list(state.spec.ops), state.spec.check_bounds)
    return state


def _hoist(state: CompileState) -> CompileState:
    before = {op.id: op.domain for op in state.spec.ops}
    spec = hoist_invariants(state.spec)
    moved = sum(1 for op in spec.ops if op.domain != before.get(op.id, op.domain))
    out = state.with_spec(spec)
    return out.note(f"{moved} ops hoisted out of loops they do not depend on") if moved else out


def _incrementalize(state: CompileState) -> CompileState:
    blocks = state.options.blocks
    assert blocks is not None
    return state.with_spec(incrementalize(state.spec, blocks, state.report.notes))


def _validate(state: CompileState) -> CompileState:
    validate(list(state.spec.ops), state.spec.check_bounds)
    return state


def _schedule(state: CompileState) -> CompileState:
    spec = state.spec
    fixed = {op.id for op in spec.outputs} | set(spec.keep)
    ops, sched = schedule_program(list(spec.ops), spec.dims, spec.until, fixed)
    out = dataclasses.replace(state, schedule=sched)
    if any(a is not b for a, b in zip(ops, spec.ops, strict=True)):
        out = out.with_spec(spec.with_ops(ops))  # ops pinned into a recurrence (schedule/pin.py)
        out.note("ops pinned into the recurrences they read at one point")
    return out


def _state_on_disk(state: CompileState) -> bool:
    """Whether a budget sends carried state to disk between updates: op order then models it
    so (``schedule/to_graph.py``)."""
    return state.options.memory_budget is not None and state.capabilities.swaps_points


def _order(state: CompileState) -> CompileState:
    spec = state.spec
    assert state.schedule is not None
    sched, reordered = order_blocks(
        state.schedule, list(spec.ops), spec.check_bounds, spec.keep, _state_on_disk(state)
    )
    out = dataclasses.replace(state, schedule=sched)
    if reordered:
        out.note(f"op order: {reordered} loop-body blocks reordered for peak memory")
    return out


def _overlap(state: CompileState) -> CompileState:
    assert state.schedule is not None
    sched, notes = overlap_host_calls(state.schedule)
    return dataclasses.replace(state, schedule=sched).note(*notes)


def _memory(state: CompileState) -> CompileState:
    """Frees, storage, donation and what a budget moves (``memory/plan.py``); each step
    timed on its own."""
    assert state.schedule is not None
    sched, plan = plan_memory(
        state.schedule,
        state.memory_program,
        state.capabilities,
        state.report.timed,
        state.report.notes,
        optimize=state.options.optimize,
        budget=state.options.memory_budget,
    )
    return dataclasses.replace(state, schedule=sched, memory=plan)


def _fuse(state: CompileState) -> CompileState:
    """What the backend runs as one compiled call (``compiler/fusion.py``), asked of its
    capabilities; on the storage the run keeps."""
    caps = state.capabilities
    assert state.schedule is not None
    storage = caps.planned_storage(state.memory.storage)
    fused = plan_fusion(state.schedule, state.spec.static, storage, caps)
    return dataclasses.replace(state, fused=fused)


def _fit_budget(state: CompileState) -> CompileState:
    """Over the budget: computations over many rows in blocks (``_fit_by_blocks``); then the
    budget is checked, and a program whose plan still exceeds it refused."""
    budget = state.options.memory_budget
    assert budget is not None
    out = state
    planned = state.memory.planned
    over = planned is not None and planned.peak_bytes is not None and planned.peak_bytes > budget
    if over and state.options.optimize and state.options.blocks is None and state.resume:
        out = _fit_by_blocks(state) or state
    assert out.memory.planned is not None
    check_budget(out.memory.planned, budget)
    return dataclasses.replace(out, resume=None)


def _optimised(state: CompileState) -> bool:
    return state.options.optimize


def _reuses(state: CompileState) -> bool:
    o = state.options
    return o.optimize and o.reuse and o.blocks is None and not _state_on_disk(state)


PASSES: tuple[Pass, ...] = (
    Pass("unread rows", _unread_rows),
    Pass("dead code", _dead_code),
    Pass("ragged lengths", _spec_pass(spread_ragged_bounds)),
    Pass("bounds", _bounds, timed=False),
    Pass(
        "empty branches",
        _spec_pass(drop_empty_branches, "ops read only by branches that apply nowhere"),
    ),
    Pass("duplicate code", _spec_pass(merge_duplicates, "duplicate ops merged"), _optimised),
    # hoisting first: what it moves out of every loop is often constant, and then folds
    Pass("loop-invariant hoisting", _hoist, _optimised),
    Pass(
        "simplification", _spec_pass(simplify, "ops removed by folding and identities"), _optimised
    ),
    # the rollout's activations it keeps would be held through the update's backward pass
    # beside the update's own: left out by blocks, and under a budget that sends state to
    # disk (memory-e8 under eager PyTorch's data / 16: a plan of 20.9 MiB with it, 16.0
    # without), even a loose one (choosing by compiling twice leaves the first compile's
    # memory resident)
    Pass("first-iteration reuse", _noting_pass(reuse_first_iteration), _reuses),
    Pass(
        "linear recurrences",
        _noting_pass(scan_recurrences),
        lambda s: s.options.optimize and s.options.scan,
    ),
    Pass(
        "vectorisation",
        _noting_pass(vectorize),
        lambda s: s.options.optimize and s.options.vectorize,
    ),
    Pass(
        "incrementalisation",
        _incrementalize,
        lambda s: s.options.optimize and s.options.blocks is not None,
    ),
    Pass("domain conditions", _spec_pass(add_guards)),
    Pass("validation", _validate),
    Pass("scheduling", _schedule, rewrites=False),
    Pass("op order (graphopt)", _order, _optimised, rewrites=False),
    Pass("overlap", _overlap, _optimised, rewrites=False),
    Pass("memory", _memory, rewrites=False, timed=False),
    Pass(
        BUDGET_SEARCH,
        _fit_budget,
        lambda s: s.options.memory_budget is not None,
        rewrites=False,
        timed=False,
    ),
    # last: it groups the final schedule's statements (a backend that fuses nothing keeps them)
    Pass("fusion", _fuse, rewrites=False),
)
RESUME_AT = "incrementalisation"  # where the budget's search over block counts starts again


def compile(
    spec: ProgramSpec,
    options: CompileOptions | None = None,
    capabilities: Capabilities | None = None,
) -> Compiled:
    """Run ``PASSES`` over ``spec``: the compiled program (see the module docstring)."""
    options = options or CompileOptions()
    state = CompileState(spec, options, capabilities or Capabilities(), CompileReport())
    given = len(spec.ops)
    state = run_passes(state, PASSES)
    state.note(f"{given} ops given, {len(state.spec.ops)} compiled")
    assert state.schedule is not None
    return Compiled(state.spec, state.schedule, state.report, state.memory, options, state.fused)


def run_passes(state: CompileState, passes: Sequence[Pass]) -> CompileState:
    """``state`` through each of ``passes`` that applies; the rewriting ones with the cyclic
    collector's work saved for after them (``_collecting_the_passes_garbage``)."""
    rewriting = [p for p in passes if p.rewrites]
    with _collecting_the_passes_garbage():
        for p in rewriting:
            state = _run(p, state)
    for p in passes[len(rewriting) :]:
        state = _run(p, state)
    return state


def _run(p: Pass, state: CompileState) -> CompileState:
    if p.name == RESUME_AT and state.options.memory_budget is not None:
        state = dataclasses.replace(state, resume=state)
    if not p.when(state):
        return state
    return state.report.timed(p.name, lambda: p.run(state)) if p.timed else p.run(state)


def _fit_by_blocks(state: CompileState) -> CompileState | None:
    """Over the budget: computations over many rows run in blocks of rows
    (``compiler/incrementalize.py``), the passes from incrementalisation on run again from
    the state they started from. More blocks hold fewer rows at once but cost more calls (and
    keep more parts of a sum where it cannot run as it goes), so the counts of
    ``BLOCK_COUNTS`` are tried in turn, fewest first; between the last that did not fit and
    the first that does, their geometric mean is tried too. The fewest blocks that fit are
    kept, else the lowest plan if it is lower than the whole program's (None: the whole
    program is kept). Only the plan kept so far is held."""
    budget = state.options.memory_budget
    whole = state.memory.planned.peak_bytes if state.memory.planned else None
    start = state.resume
    if budget is None or whole is None or start is None:
        return None
    names = [p.name for p in PASSES]
    rest = PASSES[names.index(RESUME_AT) : names.index(BUDGET_SEARCH)]
    best: tuple[CompileState, int, int] | None = None  # state, peak, blocks

    def attempt(blocks: int) -> int | None:
        """The plan's peak with ``blocks`` blocks (None: nothing runs by blocks)."""
        nonlocal best
        options = dataclasses.replace(start.options, blocks=blocks)
        tried = dataclasses.replace(start, options=options, report=start.report.copy(), resume=None)
        tried = run_passes(tried, rest)
        if len(tried.spec.dims) == len(start.spec.dims):  # no dim of blocks was added
            return None
        plan = tried.memory.planned
        peak = plan.peak_bytes if plan is not None and plan.peak_bytes is not None else 2**63
        if best is None:
            better = peak <= budget or peak < whole
        elif best[1] <= budget:
            better = peak <= budget and blocks < best[2]
        else:
            better = peak <= budget or peak < best[1]
        if better:
            best = (tried, peak, blocks)
        del tried
        gc.collect()
        return peak

    previous = None
    for blocks in BLOCK_COUNTS:
        peak = attempt(blocks)
        if peak is None:
            return None
        if peak <= budget:
            if previous is not None:
                between = round(math.sqrt(previous * blocks))
                if previous < between < blocks:
                    attempt(between)
            break
        previous = blocks
    if best is None:
        return None
    found, peak, _ = best
    return found.note(
        f"memory budget: computations over many rows run in blocks; planned peak {peak:,} bytes"
    )


@contextlib.contextmanager
def _collecting_the_passes_garbage() -> Iterator[None]:
    """Each rewriting pass leaves the graph it was given as garbage in reference cycles (a
    recurrence reads itself), which only a collection of the oldest generation frees: ten
    graphs by the end, 5 MiB for PPO on images. Freed before scheduling, whose working set is
    the compile's largest, the compile peaks at one graph and a schedule, and Python keeps
    a peak's memory resident after it (memory-e8, five alternated runs: 7.3 MiB over the
    imports after building and compiling, not 9.1). Only what the passes made is scanned:
    what existed before is frozen meanwhile, so the collection costs a few ms in a process
    holding torch's and jax's objects too, not 150. A process that froze objects itself is
    left as it is, uncollected."""
    if gc.get_freeze_count():
        yield
        return
    gc.freeze()
    try:
        yield
    finally:
        gc.collect()
        gc.unfreeze()
