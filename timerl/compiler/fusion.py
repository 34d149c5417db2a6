"""Fusion: which statements a backend runs as one compiled call, written into the schedule.

A backend that compiles several statements into one call (jax) runs a program in fewer,
larger calls; which ones is decided here, once, at compile time, from the compiled schedule,
the static bounds and what the backend can do (``memory/plan.Capabilities``, asked of the
backend object, never its name). The decisions are statements of ``schedule/fused.py``:

* a loop whose whole body traces is one ``FusedLoop`` (``fusion_loops``);
* else a top-level loop holding loops, or the outer loop a run with iteration hooks drives,
  is one ``FusedBody`` per iteration where its whole body traces (``fusion_bodies``);
* else the loop runs in Python, and each run of pure statements of its body is one
  ``Region`` (``fusion_regions``).

The runtime emits what the ``FusedSchedule`` says and decides nothing; ``explain()`` reads
its notes (each loop: one call, or why not; the regions run as numpy kernels). A run with
iteration hooks (training, resuming) needs the outer loop's iterations in Python, which
changes that one loop's decision only: ``FusedSchedule.hooked`` holds it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from timerl.compiler.fusion_bodies import BodyPlanner
from timerl.compiler.fusion_loops import LoopPlanner
from timerl.compiler.fusion_regions import RegionPlanner, Shapes
from timerl.memory.plan import Capabilities
from timerl.schedule.fused import (
    FusedBody,
    FusedLoop,
    FusedSchedule,
    FusedStmt,
    describe,
)
from timerl.schedule.program import Compute, Loop, Schedule, Stmt
from timerl.symbolic import Bound

# storage kinds whose block a loop allocates at its start (``memory/storage.py``)
_BLOCK_KINDS = ("block", "ring", "alias")


def plan_fusion(
    schedule: Schedule,
    static: Mapping[Bound, int],
    storage: Mapping[int, Any],
    caps: Capabilities,
) -> FusedSchedule:
    """The schedule's statements as a backend with ``caps`` runs them; ``static``: the
    bounds known at compile time; ``storage``: the op id -> ``Storage`` table the runtime
    keeps."""
    outer = schedule.outer_loop()
    if not caps.fuses_regions:
        return FusedSchedule(list(schedule.body), list(schedule.body), outer)
    walk = _Walk(schedule, static, storage, caps)
    body = walk.body(schedule.body, 1, None, None)
    if outer is None:
        return walk.result(body, body, None)
    plain = walk.made[id(outer)]
    hooked_outer = walk.hooked(outer, plain)
    hooked = [hooked_outer if s is plain else s for s in body]
    return walk.result(body, hooked, hooked_outer)


class _Walk:
    """The schedule's tree walked once, each loop body grouped and each loop decided."""

    def __init__(
        self,
        schedule: Schedule,
        static: Mapping[Bound, int],
        storage: Mapping[int, Any],
        caps: Capabilities,
    ) -> None:
        allocating = _allocating_loops(schedule, storage)
        self.regions = RegionPlanner(Shapes(static), caps.traced_attrs, caps.numpy_regions)
        self.loops = (
            LoopPlanner(self.regions, lambda loop: id(loop) in allocating)
            if caps.fuses_loops
            else None
        )
        self.bodies = (
            BodyPlanner(self.loops) if self.loops is not None and caps.fuses_bodies else None
        )
        self.notes: dict[str, str] = {}
        self.hooked_notes: dict[str, str] = {}
        self.made: dict[int, FusedStmt] = {}  # id of a loop -> what it became

    def result(
        self, body: list[FusedStmt], hooked: list[FusedStmt], outer: FusedStmt | None
    ) -> FusedSchedule:
        return FusedSchedule(
            body,
            hooked,
            outer,
            fuses_loops=self.loops is not None,
            loops=self.notes,
            hooked_loops=self.hooked_notes,
            kernels=self.regions.kernel_notes,
            draws=self.regions.draw_notes,
        )

    def body(
        self, stmts: list[Stmt], depth: int, outer: Loop | None, loop: Loop | None
    ) -> list[FusedStmt]:
        """``stmts`` (the body of ``loop``, run in Python; None: the top level) grouped into
        regions, each loop among them decided."""
        out: list[FusedStmt] = []
        for s in self.regions.group(stmts, loop):
            out.append(self.loop(s, depth, outer, self.notes) if isinstance(s, Loop) else s)
        return out

    def loop(self, loop: Loop, depth: int, outer: Loop | None, notes: dict) -> FusedStmt:
        """What ``loop`` (at ``depth``, 1 the top level) becomes; ``outer``: the loop whose
        iterations hooks run between (None: no hooks)."""
        ops = [s.op for s in loop.body if isinstance(s, Compute)]
        name = describe(loop, ops)
        if self.loops is not None and loop is not outer:
            found = self.loops.plan(loop, outer)
            if isinstance(found, FusedLoop):
                notes[name] = found.plan.note()
                self.made[id(loop)] = found
                return found
            notes[name] = f"runs in Python: {found}"
        nests = any(isinstance(s, Loop) for s in loop.body)
        if self.bodies is not None and (loop is outer or (depth == 1 and nests)):
            body = self._body(loop, notes)
            if body is not None:
                self.made[id(loop)] = body
                return body
        made = replace(loop, body=self.body(loop.body, depth + 1, outer, loop))
        self.made[id(loop)] = made
        return made

    def _body(self, loop: Loop, notes: dict) -> FusedBody | None:
        ops = [s.op for s in loop.body if isinstance(s, Compute)]
        found = self.bodies.plan(loop) if self.bodies is not None else "bodies are not fused"
        if isinstance(found, str):
            notes[describe(loop, ops)] = (
                f"runs in Python, a call per region and inner loop: {found}"
            )
            return None
        notes[describe(loop, ops)] = "one XLA program per iteration"
        for r in found.loops:
            inner = [s.op for s in r.loop.body if isinstance(s, Compute)]
            notes[describe(r.loop, inner)] = f"{r.plan.note()}, inside the iteration's"
        return found

    def hooked(self, outer: Loop, plain: FusedStmt) -> FusedStmt:
        """What the outer loop becomes under iteration hooks, given what it became without:
        never one call as a whole; each iteration one call where its body traces."""
        if isinstance(plain, FusedBody):
            return plain
        nests = any(isinstance(s, Loop) for s in outer.body)
        if isinstance(plain, Loop) and (nests or self.bodies is None):
            return plain  # its body's fusion was tried already (or cannot be)
        body = self._body(outer, self.hooked_notes) if self.bodies is not None else None
        if body is not None:
            return body
        if isinstance(plain, Loop):
            return plain
        # (a whole loop's body traces: grouped, it makes no region that runs as kernels)
        return replace(outer, body=self.body(outer.body, 2, outer, outer))


def _allocating_loops(schedule: Schedule, storage: Mapping[int, Any]) -> set[int]:
    """The ids of the loops that allocate a block store at their start: the loop whose body
    first computes the op (``runtime/store_plan.StorePlan`` allocates them the same way)."""
    seen: set[int] = set()
    out: set[int] = set()

    def visit(body: list[Stmt], loop: Loop | None) -> None:
        for s in body:
            if isinstance(s, Loop):
                visit(s.body, s)
            elif isinstance(s, Compute) and loop is not None:
                st = storage.get(s.op.id)
                if st is not None and st.kind in _BLOCK_KINDS and s.op.id not in seen:
                    seen.add(s.op.id)
                    out.add(id(loop))

    visit(schedule.body, None)
    return out
