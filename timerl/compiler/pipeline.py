"""The compiler: ``compile(spec) -> Compiled``, one list of passes read top to bottom.

Every pass maps a ``ProgramSpec`` to a new one (or builds a side value such as the schedule)
and never changes the ops it was given, so programs compiled from one context are independent
values. Each pass is timed for ``prog.explain()``. ``optimize=False`` keeps only the passes
that correctness needs: the unoptimised reference every optimisation is tested against.
"""

from __future__ import annotations

import contextlib
import gc
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import TypeVar

from timerl.compiler.branches import drop_empty_branches
from timerl.compiler.cse import merge_duplicates
from timerl.compiler.dce import eliminate_dead_code
from timerl.compiler.donation import plan_donations
from timerl.compiler.guards import add_guards
from timerl.compiler.hoist import hoist_invariants
from timerl.compiler.incrementalize import incrementalize
from timerl.compiler.ragged import spread_ragged_bounds
from timerl.compiler.reuse import enabled as reuse_enabled
from timerl.compiler.reuse import reuse_first_iteration
from timerl.compiler.scan import enabled as scan_enabled
from timerl.compiler.scan import scan_recurrences
from timerl.compiler.simplify import simplify
from timerl.compiler.spec import ProgramSpec
from timerl.compiler.storage import Storage, plan_storage
from timerl.compiler.vectorize import enabled as vectorize_enabled
from timerl.compiler.vectorize import vectorize
from timerl.ir.validate import check_bounds, check_not_empty, validate
from timerl.schedule.fused import FusedSchedule
from timerl.schedule.liveness import add_frees
from timerl.schedule.order import order_blocks
from timerl.schedule.overlap import overlap_host_calls
from timerl.schedule.program import Schedule
from timerl.schedule.scheduler import schedule_program

T = TypeVar("T")


@dataclass
class CompileReport:
    timings: list[tuple[str, float]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def timed(self, name: str, fn: Callable[[], T]) -> T:
        start = time.perf_counter()
        out = fn()
        self.timings.append((name, time.perf_counter() - start))
        return out


@dataclass(frozen=True)
class Compiled:
    """The compiled program: its final graph, schedule (with memory statements) and report."""

    spec: ProgramSpec
    schedule: Schedule
    report: CompileReport
    storage: Mapping[int, Storage] = field(default_factory=dict)  # op id -> storage (else point)
    # op id -> the input position whose dead buffer it writes into (compiler/donation.py)
    donations: Mapping[int, int] = field(default_factory=dict)
    # the statements as the backend runs them: regions, fused loops and iterations
    # (compiler/fusion.py, given the backend's capabilities); None: not fused yet
    fused: FusedSchedule | None = None


def compile(
    spec: ProgramSpec,
    optimize: bool = True,
    blocks: int | None = None,
    state_on_disk: bool = False,
) -> Compiled:
    """``blocks``: run computations over many rows in about that many blocks of rows
    (``compiler/incrementalize.py``; a memory budget asks for it). First-iteration reuse,
    which keeps the rollout's activations for the update, is then left out.
    ``state_on_disk`` (a memory budget on numpy): order loop bodies for carried state that the
    budget swaps to disk between updates (``compiler/point_swap.py``); reuse is left out too,
    since the rollout's activations it keeps are held through the update's backward pass
    next to the update's own (memory-e8 under eager PyTorch's data / 16: a plan of 20.9 MiB
    with it, 16.0 without). Under any budget, even a loose one that would run faster with it
    (memory-e32: 0.64x eager PyTorch's iteration with it, 0.92x without): choosing by
    compiling twice leaves the first compile's memory resident, 6.5 MiB on memory-e8, which
    then ran over its budget."""
    report = CompileReport()
    given = len(spec.ops)

    with _collecting_the_passes_garbage():
        reuse = blocks is None and not state_on_disk
        spec = _rewritten(spec, report, optimize, reuse, blocks)
    ops = list(spec.ops)
    fixed = {op.id for op in spec.outputs} | set(spec.keep)
    ops, sched = report.timed(
        "scheduling", lambda: schedule_program(ops, spec.dims, spec.until, fixed)
    )
    if any(a is not b for a, b in zip(ops, spec.ops, strict=True)):
        spec = spec.with_ops(ops)  # ops pinned into a recurrence (schedule/pin.py)
        report.notes.append("ops pinned into the recurrences they read at one point")
    if optimize:
        sched, reordered = report.timed(
            "op order (graphopt)",
            lambda: order_blocks(sched, ops, spec.check_bounds, spec.keep, state_on_disk),
        )
        if reordered:
            report.notes.append(f"op order: {reordered} loop-body blocks reordered for peak memory")
        sched, notes = report.timed("overlap", lambda: overlap_host_calls(sched))
        report.notes.extend(notes)
    planned = report.timed("memory statements", lambda: add_frees(sched, ops, spec.keep))
    table: dict[int, Storage] = {}
    donations: dict[int, int] = {}
    if optimize:
        planned, table = report.timed(
            "storage", lambda: plan_storage(sched, planned, ops, spec.static, spec.keep)
        )
        stores = sum(1 for s in table.values() if s.kind == "block")
        rings = sum(1 for s in table.values() if s.kind == "ring")
        if stores or rings:
            views = sum(1 for s in table.values() if s.kind == "view")
            report.notes.append(
                f"storage: {stores} block stores, {views} views of blocks, {rings} circular buffers"
            )
        donations = report.timed("donation", lambda: plan_donations(planned, ops, table, spec.keep))
        if donations:
            report.notes.append(f"donation: {len(donations)} ops write into a dead input's buffer")
    report.notes.append(f"{given} ops given, {len(ops)} compiled")
    return Compiled(spec, planned, report, table, donations)


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


def _rewritten(
    spec: ProgramSpec, report: CompileReport, optimize: bool, reuse: bool, blocks: int | None
) -> ProgramSpec:
    """The spec after the rewriting passes, validated."""

    def rewrite(name: str, fn: Callable[[ProgramSpec], ProgramSpec], what: str = "") -> None:
        nonlocal spec
        before = {op.id: op.domain for op in spec.ops}
        spec = report.timed(name, lambda: fn(spec))
        if what == "hoisted":
            moved = sum(1 for op in spec.ops if op.domain != before.get(op.id, op.domain))
            if moved:
                report.notes.append(f"{moved} ops hoisted out of loops they do not depend on")
        elif what and len(spec.ops) != len(before):
            report.notes.append(f"{len(before) - len(spec.ops)} {what}")

    rewrite("dead code", eliminate_dead_code, "dead ops removed")
    check_not_empty(list(spec.ops))
    rewrite("ragged lengths", spread_ragged_bounds)
    # before any pass sizes a dim: a bound left out is the user's error, named as such
    check_bounds(list(spec.ops), spec.check_bounds)
    rewrite("empty branches", drop_empty_branches, "ops read only by branches that apply nowhere")
    if optimize:
        rewrite("duplicate code", merge_duplicates, "duplicate ops merged")
        # hoisting first: what it moves out of every loop is often constant, and then folds
        rewrite("loop-invariant hoisting", hoist_invariants, "hoisted")
        rewrite("simplification", simplify, "ops removed by folding and identities")
        if reuse_enabled() and reuse:
            rewrite("first-iteration reuse", lambda s: reuse_first_iteration(s, report.notes))
        if scan_enabled():
            rewrite("linear recurrences", lambda s: scan_recurrences(s, report.notes))
        if vectorize_enabled():
            rewrite("vectorisation", lambda s: vectorize(s, report.notes))
        if blocks is not None:
            rewrite("incrementalisation", lambda s: incrementalize(s, blocks, report.notes))
    rewrite("domain conditions", add_guards)
    report.timed("validation", lambda: validate(list(spec.ops), spec.check_bounds))
    return spec
