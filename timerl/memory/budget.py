"""The memory budget: a plan over ``ctx.compile(memory_budget=...)`` is refused or fitted.

``check_budget`` turns a planned peak (``memory/replay.py``) over the budget into a
compile-time ``MemoryBudgetError`` naming the smallest budget that fits and the tensor holding
the most bytes at the peak, so a program that would not fit never starts.

Under a budget the peak exceeds, moves are tried, each kept only where the replayed peak
drops: ``plan_swaps`` writes a whole idle block to disk and reads it back before its next
reader; ``memory/streams.py`` keeps a block read only by rows in a file for good;
``memory/point_swap.py`` sends optimiser state and idle values to disk between their uses.
"""

from __future__ import annotations

from collections.abc import Mapping

from timerl.errors import MemoryBudgetError
from timerl.ir.graph import Op
from timerl.memory.replay import PlannedPeak, format_bytes, planned_peak, row_bytes
from timerl.memory.storage import Storage
from timerl.schedule.program import (
    Compute,
    Loop,
    Position,
    Schedule,
    Stmt,
    SwapIn,
    SwapOut,
    idle_gaps,
    rewrite,
)
from timerl.symbolic import Bound


def check_budget(plan: PlannedPeak, budget: int) -> None:
    """Raise ``MemoryBudgetError`` when the planned peak exceeds ``budget`` bytes."""
    if plan.peak_bytes is None or plan.peak_bytes <= budget:
        return
    top = plan.holders[0] if plan.holders else ("?", 0)
    others = ", ".join(f"{name} {format_bytes(b)}" for name, b in plan.holders[1:4])
    raise MemoryBudgetError(
        f"the program needs {format_bytes(plan.peak_bytes)} ({plan.peak_bytes} bytes) at its "
        f"peak, over the memory budget of {format_bytes(budget)} ({budget} bytes); the "
        f"smallest budget that fits is memory_budget={plan.peak_bytes}. "
        + (f"The peak is reached computing {plan.peak_at}; the " if plan.peak_at else "The ")
        + f"largest tensor live then is {top[0]} ({format_bytes(top[1])})"
        + (f"; next: {others}" if others else "")
        + ". Swapping idle blocks to disk and streaming blocks read by rows do not bring it "
        "lower. Lower the batch "
        "(envs x steps) or the observation size, or raise the budget.",
        smallest=plan.peak_bytes,
    )


def plan_swaps(
    sched: Schedule,
    ops: list[Op],
    storage: Mapping[int, Storage],
    static: Mapping[Bound, int],
    dynamic: Mapping[Bound, int | None],
    budget: int,
    donations: Mapping[int, int] | None = None,
) -> tuple[Schedule, PlannedPeak, list[str]]:
    """Swap block stores to disk where that brings the planned peak under ``budget``.

    A candidate is a block (no alias or view of it) that is idle between two statements of
    the body holding its loop: after the loop that writes it (or a reader) and before its next
    reader. Candidates are tried largest first; a swap is kept when it lowers the peak.
    """
    plan = planned_peak(sched, ops, storage, static, dynamic, donations)
    notes: list[str] = []
    if plan.peak_bytes is None or plan.peak_bytes <= budget:
        return sched, plan, notes
    shared = {s.base for s in storage.values() if s.kind in ("alias", "view")}
    blocks = {i for i, s in storage.items() if s.kind == "block" and i not in shared}
    by_id = {op.id: op for op in ops}
    candidates: list[tuple[int, tuple, int, int]] = []  # (op id, body path, after, before)

    def visit(body: list[Stmt], path: tuple) -> None:
        for k, s in enumerate(body):
            if not isinstance(s, Loop):
                continue
            visit(s.body, path + (k,))
            for x in s.body:
                if isinstance(x, Compute) and x.op.id in blocks:
                    for a, b in idle_gaps(body, k, x.op.id):
                        candidates.append((x.op.id, path, a, b))

    visit(sched.body, ())
    nbytes = {i: int(storage[i].extent or 0) * row_bytes(by_id[i]) for i in blocks}
    candidates.sort(key=lambda c: -nbytes[c[0]] * (c[3] - c[2]))
    for op_id, path, after, before in candidates:
        op = by_id[op_id]
        trial = _swapped_between(sched, op, (*path, after), (*path, before))
        tried = planned_peak(trial, ops, storage, static, dynamic, donations)
        if tried.peak_bytes is not None and tried.peak_bytes < (plan.peak_bytes or 0):
            sched, plan = trial, tried
            notes.append(f"swap: {op.label} to disk while it is idle")
            if plan.peak_bytes is not None and plan.peak_bytes <= budget:
                break
    return sched, plan, notes


def _swapped_between(sched: Schedule, op: Op, out_at: Position, in_at: Position) -> Schedule:
    """``sched`` with block store ``op`` written to disk after the statement at ``out_at`` and
    read back before the one at ``in_at``."""
    prefix = tuple(op.domain[:-1])

    def edit(s: Stmt, at: Position) -> list[Stmt] | None:
        if at == out_at:
            return [s, SwapOut(op, prefix)]
        if at == in_at:
            return [SwapIn(op, prefix), s]
        return None

    return Schedule(rewrite(sched.body, edit))
