"""Overlap: the driver computes while a host call runs elsewhere (an env step on Ray workers).

A host op with a ``begin`` attribute can be started and waited for separately: ``begin(*inputs)``
sends the work off and returns at once, and the op's ordinary call, later, waits for the result
(``RayVectorEnv.step_async`` / ``step``). In each loop body (and at the top level) this pass
rewrites ``[..., E, ...]`` for such an op ``E`` into

    what E needs, Start(E), what neither needs E nor E needs, Compute(E), what needs E

so every statement that does not depend on the pending call runs while it is in flight. The
order is otherwise kept. A statement needs E when it reads, at any point, E or a statement
that needs E (reads of another iteration's point count too: the rule is conservative, not
exact). Effects and other host calls stay in their written order around E: they neither move
past E's start nor between its start and its wait. A loop nested in the body moves as one
statement, by the reads of every op inside it.

It runs on the schedule before the memory statements, so the frees, storage and donations are
planned on the new order. In PPO's rollout every statement of a step depends on the previous
step's observation, so nothing moves there; a program with work that does not (a learner
update from a replay buffer inside the acting loop, statistics of earlier points) gains it.
"""

from __future__ import annotations

from dataclasses import replace

from timerl.ir import prims
from timerl.ir.graph import Op
from timerl.schedule.program import Compute, Loop, Schedule, Start, Stmt


def overlap_host_calls(sched: Schedule) -> tuple[Schedule, list[str]]:
    """The schedule with each startable host call's independent statements moved between its
    start and its wait; notes for ``explain()`` naming each call and how many statements run
    while it is in flight."""
    notes: list[str] = []
    body = _rewrite(sched.body, notes)
    return (Schedule(body) if notes else sched), notes


def _startable(s: Stmt) -> bool:
    return isinstance(s, Compute) and callable(s.op.attrs.get("begin"))


def _rewrite(body: list[Stmt], notes: list[str]) -> list[Stmt]:
    out = [replace(s, body=_rewrite(s.body, notes)) if isinstance(s, Loop) else s for s in body]
    k = 0
    while k < len(out):
        s = out[k]
        if _startable(s):
            out, moved = _split(out, k)
            notes.append(
                f"overlap: {moved} statements run while {s.op.label} is in flight"
                if moved
                else f"overlap: nothing to run while {s.op.label} is in flight (every later "
                "statement needs it)"
            )
            k = out.index(s)
        k += 1
    return out


def _ops(s: Stmt) -> list[Op]:
    if isinstance(s, (Compute, Start)):
        return [s.op]
    if isinstance(s, Loop):
        out = []
        for x in s.body:
            out.extend(_ops(x))
        return out
    return []


def _ordered(s: Stmt) -> bool:
    """An effect, a host call or a start: keeps its place among the others."""
    if isinstance(s, Start):
        return True
    return any(op.effect or prims.get(op.prim).traits.host for op in _ops(s))


def _reads(s: Stmt) -> set[int]:
    return {e.src.id for op in _ops(s) for e in op.inputs}


def _split(body: list[Stmt], k: int) -> tuple[list[Stmt], int]:
    call = body[k]
    before, after = body[:k], body[k + 1 :]
    # what the call needs before it starts: its inputs computed in this body, the effects
    # before it, and (transitively) what those read
    needed: set[int] = _reads(call)
    stay: list[bool] = [False] * len(before)
    for j in range(len(before) - 1, -1, -1):
        s = before[j]
        if _ordered(s) or any(op.id in needed for op in _ops(s)):
            stay[j] = True
            needed |= _reads(s)
    # what needs the call: its readers, what reads them, and every later effect
    tainted: set[int] = {call.op.id}
    waits: list[bool] = []
    for s in after:
        hit = _ordered(s) or bool(_reads(s) & tainted)
        if hit:
            tainted.update(op.id for op in _ops(s))
        waits.append(hit)
    free_before = [s for s, keep in zip(before, stay, strict=True) if not keep]
    free_after = [s for s, w in zip(after, waits, strict=True) if not w]
    moved = len(free_before) + len(free_after)
    if not moved:
        return body, 0
    head = [s for s, keep in zip(before, stay, strict=True) if keep]
    tail = [s for s, w in zip(after, waits, strict=True) if w]
    return [*head, Start(call.op), *free_before, *free_after, call, *tail], moved
