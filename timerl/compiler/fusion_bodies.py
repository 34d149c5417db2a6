"""Which loops run one iteration as one call (``schedule/fused.FusedBody``): one XLA program.

``fusion_loops`` fuses an inner loop whose body traces into one ``lax.fori_loop``, but the
outer loop (a training iteration ``i``) still runs in Python: between its inner loops the
straight-line statements are regions of their own, so a PPO iteration is about a dozen calls,
each with its Python around it. Here the whole body of the outer loop is traced once, with
``i`` a traced integer: its straight-line ops as steps, its inner loops as nested
``fori_loop``s (each planned by ``fusion_loops``), so an iteration is ONE call. The loop
itself stays in Python, so iteration hooks (metrics, checkpoints) run between iterations on
the values the call returned, written to their stores.

The body is fused when every inner loop fuses (``fusion_loops``' conditions), every
straight-line op traces and is computed at one point per iteration, and its host calls (a
metrics sink, an episode tally) feed nothing traced: those run after the call, in schedule
order, on stored values. ``explain()`` says "one XLA program per iteration" or why not.

Inside the call a value computed in the iteration is read where it was computed: a
straight-line value as it is, an inner loop's at one point (its last iteration's value, or a
row of its every-iteration array), a slice of it, or per iteration of a later inner loop
(``rows``: the array itself, or its rows at the later loop's index expression). Anything
else (an earlier iteration's value: parameters, Adam moments, env state at ``i - 1``; values
computed before the loop) is read from its store before the call, zeros where a branch's point
does not exist. Those values stay device arrays between calls.

After the call only what outlives the iteration is written to stores (not freed in it at this
iteration's point) or what a deferred host call reads; the body's frees then replay in
schedule order, so stores, statement counts and live bytes after each iteration equal the
Python loop's (inside the call the meter counts the body's values live together).
"""

from __future__ import annotations

from typing import Any

from timerl.compiler.fusion_loops import LoopPlanner, step_for, symbols_of
from timerl.ir import prims
from timerl.ir.graph import Edge, Op
from timerl.schedule.fused import (
    BodyPlan,
    FusedBody,
    FusedLoop,
    LoopStep,
    NestedLoop,
    nbytes_of,
)
from timerl.schedule.program import Compute, Free, Loop, Stmt
from timerl.symbolic import Bound, Const, Dim, Slice


class _No(Exception):
    """Why the body cannot be one call (its message is shown by ``explain()``)."""


class BodyPlanner:
    """Plans fused iterations, their inner loops through a ``LoopPlanner``."""

    def __init__(self, loops: LoopPlanner) -> None:
        self.loops = loops
        self.regions = loops.regions
        self.shapes = loops.shapes

    def plan(self, loop: Loop) -> FusedBody | str:
        """Each iteration of ``loop`` as one call, or why not."""
        try:
            return self._plan(loop)
        except _No as why:
            return str(why)

    def _plan(self, loop: Loop) -> FusedBody:
        shapes, dim = self.shapes, loop.dim
        if loop.until is not None:
            raise _No(f"it ends when {loop.until.label} holds (until)")
        if self.loops.allocates(loop):
            raise _No("it allocates block stores")
        consts = {b: int(v.value) for b, v in shapes.bounds.items()}
        self.dim = dim
        self.top: dict[int, Op] = {}
        self.inner: dict[int, int] = {}  # op id -> position of its nested loop
        self.fused: list[FusedLoop] = []
        # every op the body computes: one read before its computation must not go to a store
        self.body_ops = _computed(loop.body)
        self.inputs: list[tuple[str, Edge, Loop | None]] = []
        self.input_pos: dict[tuple, int] = {}
        deferred: dict[int, Op] = {}
        items: list[LoopStep | int] = []
        nested: list[NestedLoop] = []
        frees: list[Free] = []
        for s in loop.body:
            if isinstance(s, Free):
                frees.append(s)
            elif isinstance(s, Compute):
                op = s.op
                if prims.get(op.prim).traits.host:
                    deferred[op.id] = op
                    continue
                why = self.regions.why_not_traced(op)
                if why is not None:
                    raise _No(why)
                if tuple(op.domain) != (dim,):
                    raise _No(f"{op.label} is computed in the loop but not over {dim.name} alone")
                items.append(self._step(op, deferred, consts))
                self.top[op.id] = op
            elif isinstance(s, Loop):
                found = self.loops.plan(s, None)
                if isinstance(found, str):
                    raise _No(f"its loop over {s.dim.name} runs in Python: {found}")
                for e in [*found.closed, *found.rows]:
                    if e.src.id in deferred:
                        raise _No(f"host call {e.src.label} feeds traced ops")
                closed = [self._ref(e) for e in found.closed]
                rows = [self._moving(e, s, found.plan.extent) for e in found.rows]
                for st in found.plan.steps:
                    if set(symbols_of(tuple(st.traced.values()))) - {dim, s.dim} - set(consts):
                        raise _No(f"an attribute in its loop over {s.dim.name} is not static")
                if set(found.plan.symbols) - {dim}:
                    raise _No(f"its loop over {s.dim.name} reads an index other than {dim.name}")
                position = len(nested)
                for op in found.ops:
                    self.inner[op.id] = position
                frees.extend(x for x in s.body if isinstance(x, Free))
                nested.append(NestedLoop(found.plan, closed, rows, frozenset()))
                self.fused.append(found)
                items.append(position)
            else:
                raise _No(f"it holds a {type(s).__name__} statement")
        if not items:
            raise _No("it computes nothing")

        # what outlives the iteration, or is read by a host call run after it
        killed = {
            f.op.id
            for f in frees
            if not f.pinned and len(f.prefix) == 1 and f.prefix[0] is dim and f.op.domain[0] is dim
        }
        computed = set(self.top) | set(self.inner)
        needed = computed - killed
        for op in deferred.values():
            for e in op.inputs:
                if e.src.id in computed:
                    needed.add(e.src.id)
        for k, nest in enumerate(nested):
            nest.keep = frozenset(op.id for op in self.fused[k].ops if op.id in needed)
            nest.keep_rows = nest.keep - self.fused[k].single_rows()
        outs = tuple(op_id for op_id in self.top if op_id in needed)
        donate = self._donations(frees, deferred, outs, nested)
        plan = BodyPlan(dim, consts, items, nested, outs, donate, len(self.inputs))
        live = sum(nbytes_of(st.shape, st.dtype) for st in items if isinstance(st, LoopStep))
        live += sum(r.live_bytes for r in self.fused)
        key = (
            "body",
            tuple(self.top),
            tuple(tuple(op.id for op in r.ops) for r in self.fused),
            tuple((kind, e.src.id, tuple(str(i) for i in e.index)) for kind, e, _ in self.inputs),
        )
        return FusedBody(
            loop,
            plan,
            list(self.inputs),
            list(self.fused),
            list(self.top.values()),
            set(deferred),
            needed,
            live,
            key,
        )

    def _donations(
        self, frees: list[Free], deferred: dict[int, Op], outs: tuple, nested: list[NestedLoop]
    ) -> tuple[tuple[int, int], ...]:
        """The inputs whose buffers the call may take over (``jax.jit``'s donation): an
        earlier iteration's value of an op the call itself returns (parameters, optimiser
        moments, env state at ``i - 1``), whose point the iteration's frees release, read
        by no host call run after the call. Whether the array passed is the one the previous
        call returned (not a filler, an initial value or one shared by two inputs) is checked
        when it is called."""
        returned = set(outs)
        for nest in nested:
            returned |= {m for m in nest.keep if m in nest.plan.finals}
        host = {e.src.id for op in deferred.values() for e in op.inputs}
        out = []
        for k, (kind, edge, _) in enumerate(self.inputs):
            src = edge.src.id
            if kind != "closed" or src not in returned or src in host:
                continue
            if not _other_iteration(edge, self.dim):
                continue
            point = tuple(str(x) for x in edge.index)
            if any(
                f.op.id == src
                and not f.pinned
                and tuple(str(x) for x in f.prefix) == point[: len(f.prefix)]
                for f in frees
            ):
                out.append((k, src))
        return tuple(out)

    def _step(self, op: Op, deferred: dict[int, Op], consts: dict) -> LoopStep:
        dim = self.dim
        refs = []
        for e in op.inputs:
            if e.src.id in deferred:
                raise _No(f"host call {e.src.label} feeds {op.label}, a traced op")
            refs.append(self._ref(e))
        step, used = step_for(op, refs, self.shapes)
        other = set(used) - {dim} - set(consts)
        if other:
            names = ", ".join(sorted(s.name for s in other))
            what = "bound" if all(isinstance(s, Bound) for s in other) else "index"
            raise _No(f"{op.label} reads {what} {names}, which is not static")
        return step

    def _input(self, kind: str, edge: Edge, loop: Loop | None) -> tuple:
        key = (kind, edge.src.id, tuple(str(i) for i in edge.index))
        if key not in self.input_pos:
            self.input_pos[key] = len(self.inputs)
            self.inputs.append((kind, edge, loop))
        return ("in", self.input_pos[key])

    def _inner_point(self, edge: Edge) -> tuple[FusedLoop, Any]:
        """The nested loop computing ``edge.src`` and the index read along its dim."""
        src, dim = edge.src, self.dim
        region = self.fused[self.inner[src.id]]
        if len(src.domain) != 2 or dim not in src.domain or region.loop.dim not in src.domain:
            raise _No(f"{src.label} is not computed over ({dim.name}, {region.loop.dim.name})")
        if edge.index[src.domain.index(dim)] is not dim:
            raise _No(f"{edge.src.label} is read at another point of {dim.name}")
        return region, edge.index[src.domain.index(region.loop.dim)]

    def _outside(self, edge: Edge) -> bool:
        """The read is of a value from outside this iteration (read from its store)."""
        src = edge.src
        if _other_iteration(edge, self.dim):
            return True
        if src.id in self.top or src.id in self.inner:
            return False
        if src.id in self.body_ops:
            raise _No(f"{src.label} is read in the iteration before it is computed")
        return True

    def _ref(self, edge: Edge) -> tuple:
        """Where a value read at one point (per iteration of the body) comes from."""
        src, dim = edge.src, self.dim
        if self._outside(edge):
            return self._input("closed", edge, None)
        if src.id in self.top:
            if len(edge.index) != len(src.domain) or any(
                i is not d for i, d in zip(edge.index, src.domain, strict=True)
            ):
                raise _No(f"{src.label} is read at another point of {dim.name}")
            return ("val", src.id)
        region, idx = self._inner_point(edge)
        plan = region.plan
        stacked = src.id in plan.rows_out
        bounds = self.shapes.bounds
        if isinstance(idx, Slice):
            fixed_a, a = self.shapes.value(idx.start)
            fixed_b, b = self.shapes.value(idx.stop)
            if not (fixed_a and fixed_b and stacked):
                raise _No(f"a slice of {src.label} is read that is not whole rows of its loop")
            return ("slice", src.id, int(a), int(b))
        if stacked:
            if symbols_of(idx) - {dim} - set(bounds):
                raise _No(f"{src.label} is read at a point that is not static")
            return ("at", src.id, idx.substitute(bounds))
        last = plan.extent - 1 if plan.forward else 0
        fixed, v = self.shapes.value(idx)
        if src.id in plan.finals and fixed and int(v) == last:
            return ("fin", src.id)
        raise _No(f"{src.label} is read after its loop at a point the loop does not keep")

    def _moving(self, edge: Edge, loop: Loop, n: int) -> tuple:
        """Where a value read at every iteration of the nested ``loop`` comes from."""
        src, dim = edge.src, self.dim
        if self._outside(edge):
            return self._input("rows", edge, loop)
        if src.id in self.top:
            raise _No(f"{src.label} is read along {loop.dim.name} but computed once")
        region, idx = self._inner_point(edge)
        if src.id not in region.plan.rows_out:
            raise _No(f"{src.label} is read per iteration but its loop keeps only its last")
        if idx is loop.dim and region.plan.extent == n:
            return ("rows", src.id)
        if symbols_of(idx) - {dim, loop.dim} - set(self.shapes.bounds):
            raise _No(f"{src.label} is read at a point that is not static")
        return ("moving", src.id, idx.substitute(self.shapes.bounds), loop.dim, n)


def _computed(stmts: list[Stmt]) -> set[int]:
    """The ids of the ops a loop body computes, inner loops included."""
    out: set[int] = set()
    for s in stmts:
        if isinstance(s, Compute):
            out.add(s.op.id)
        elif isinstance(s, Loop):
            out |= _computed(s.body)
    return out


def _other_iteration(edge: Edge, dim: Dim) -> bool:
    """The read is of another iteration's point (``w[i - 1, U - 1]``): stored before the call."""
    if dim not in edge.src.domain:
        return False
    idx = edge.index[edge.src.domain.index(dim)]
    if isinstance(idx, Slice):
        return False
    off = idx - dim
    return isinstance(off, Const) and off.value != 0
