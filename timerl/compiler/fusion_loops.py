"""Which loops run as one call (``schedule/fused.FusedLoop``), and the plan a backend traces.

Regions cut a loop body's dispatch to one call per run of pure statements, but Python still
drives every iteration: a PPO update loop of forty minibatch steps calls its regions forty
times. A loop whose whole body can be traced runs instead as ONE call of
``backend.fuse_loop``; this module decides which loops can and plans the call (``LoopPlan``).

A loop is fused when its bound is static, it has no ``until``, it is not the program's outer
loop under iteration hooks (they run between its iterations), it allocates no block stores,
and every statement of its body is a compute statement that can be traced
(``RegionPlanner.why_not_traced``: no host call, no shape that changes with the point) or a
free; a nested loop keeps it out (a top-level loop holding loops runs an iteration at a time
as one call instead: ``fusion_bodies``).

Inside the traced loop the loop index is a traced integer. What the body reads:

* values of the loop at this iteration: the traced value itself;
* values of the loop at another iteration (``x[u - 1]``, ``x[t + 1]`` in a backward loop):
  the carry. A value read only at the previous iteration carries its last value; any other
  offset carries a preallocated array of all its iterations, written with ``.at[u].set`` and
  read at the traced index;
* values from outside at a point that does not move with the loop index: read once before the
  call and closed over;
* values from outside at a point that moves with it (``obs[i, t]``): the point of each
  iteration read before the call (all iterations' points together) and indexed by the traced
  index inside.

Index expressions, guards and merge conditions are evaluated on the traced index, random keys
take it as a coordinate (``counter_rng`` hashes traced integers as it hashes Python ints, so
the draws are the reference's). A merge selects its branch with ``where`` over every branch's
value: no first or last iteration is peeled, so a loop is one trace whatever its bound.
Guarded ops are computed at every iteration and their values used only where the guard holds
(a guarded-off value is never read: the program was validated).

After the call, the points of the loop's values that the loop's frees leave alive (all of
them for a value with no free in the loop, the pinned ones for a value freed point by point
``unless u in [U - 1]``) are written to their stores, exactly the points the Python loop would
have left, and frees of values from outside the loop made inside it are replayed. Memory
accounting is exact at the loop's boundaries; inside, the meter counts one iteration's
values and the carried state (previous values, arrays of all iterations) live for the whole
loop, as they are in the compiled loop.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from timerl.compiler.fusion_regions import RegionPlanner, Shapes
from timerl.ir import prims
from timerl.ir.graph import Edge, Op
from timerl.schedule.fused import FusedLoop, LoopPlan, LoopStep, nbytes_of
from timerl.schedule.point_attrs import key_coordinates, point_attrs
from timerl.schedule.program import Compute, Free, Loop
from timerl.symbolic import TRUE, Bound, Condition, Const, Dim, Expr, Slice, Symbol


def step_for(op: Op, refs: list[tuple], shapes: Shapes) -> tuple[LoopStep, set]:
    """The traced step computing ``op`` (a merge's conditions, or its per-point attributes
    fixed or traced and a random key's coordinates) and the symbols its traced parts use.
    Shared by a fused loop and a fused iteration (``fusion_bodies``); the runtime binds the
    kernel."""
    rule = prims.get(op.prim)
    step = LoopStep(op.id, shapes.shape(op.shape), op.dtype, refs)
    step.multi = rule.traits.multi_output
    used: set = set()
    if rule.traits.piecewise:
        step.merge = True
        step.conds = tuple(e.cond for e in op.inputs)
        return step, used | symbols_of(step.conds)
    for name, value in point_attrs(op):
        fixed, v = shapes.value(value)
        if fixed:
            step.kwargs[name] = v
        else:
            step.traced[name] = value
            used |= symbols_of(value)
    coords = key_coordinates(op)
    if coords is not None:
        step.coords = coords
        used |= symbols_of(coords)
    return step, used


def symbols_of(item: Any) -> frozenset:
    if isinstance(item, (tuple, list)):
        return frozenset().union(*(symbols_of(x) for x in item)) if item else frozenset()
    if isinstance(item, (Expr, Condition, Slice)):
        return item.symbols()
    return frozenset()


def _derived_histories(
    rows_out: list[tuple[Op, Any]], hist: dict[int, tuple], read_around: set[int], shapes: dict
) -> dict[int, tuple[int, tuple[int, ...]]]:
    """Stacked values that need no history of their own: a contiguous view (a reshape,
    identity or detach) of another stacked value at the same point, read at no other
    iteration inside the loop, is that value's history reshaped after the loop. (PPO's
    flattened observations: without this the rollout kept every image twice.)"""
    out: dict[int, tuple[int, tuple[int, ...]]] = {}
    for op, _ in rows_out:
        if op.id in read_around or len(op.inputs) != 1:
            continue
        if prims.get(op.prim).traits.whole_view != "contiguous" or op.guard != TRUE:
            continue
        e = op.inputs[0]
        source = out[e.src.id][0] if e.src.id in out else e.src.id
        if source not in hist or e.cond != TRUE or e.src.dtype != op.dtype:
            continue
        if tuple(op.domain) != tuple(e.src.domain):
            continue
        if not all(i is d for i, d in zip(e.index, op.domain, strict=True)):
            continue
        out[op.id] = (source, shapes[op.id][0])
    return out


def _earlier_instance(edge: Edge, dim: Dim) -> bool:
    """The read is of a point another run of this loop computed: some coordinate of an
    enclosing dim is that dim plus a nonzero constant (``next_obs[i - 1, T - 1]``, read at
    ``t == 0``). The schedule ran that point already, so it is read from its store like any
    value from outside the loop."""
    for i, d in zip(edge.index, edge.src.domain, strict=True):
        if d is dim or isinstance(i, Slice):
            continue
        off = i - d
        if isinstance(off, Const) and off.value != 0:
            return True
    return False


class LoopPlanner:
    """Plans fused loops. ``allocates``: whether a loop allocates block stores (the runtime
    allocates those in Python, at the loop's start)."""

    def __init__(self, regions: RegionPlanner, allocates: Callable[[Loop], bool]) -> None:
        self.regions = regions
        self.shapes = regions.shapes
        self.allocates = allocates

    def plan(self, loop: Loop, outer: Loop | None) -> FusedLoop | str:
        """``loop`` as one call, or why it runs in Python; ``outer``: the loop iteration
        hooks run between the iterations of (None: none)."""
        ops = [s.op for s in loop.body if isinstance(s, Compute)]
        if loop is outer:
            return "it is the program's outer loop (iteration hooks run between iterations)"
        if loop.until is not None:
            return f"it ends when {loop.until.label} holds (until)"
        shapes = self.shapes
        bounds = shapes.bounds
        dim = loop.dim
        if dim.bound not in bounds:
            return f"its bound {dim.bound.name} is not static"
        extent = int(bounds[dim.bound].value)
        if self.allocates(loop):
            return "it allocates block stores"
        for s in loop.body:
            if isinstance(s, Loop):
                return f"it holds a nested loop over {s.dim.name}"
            if not isinstance(s, (Compute, Free)):
                return f"it holds a {type(s).__name__} statement"
        if not ops:
            return "it computes nothing"
        members = {op.id: op for op in ops}
        for op in ops:
            why = self.regions.why_not_traced(op)
            if why is not None:
                return why
            if dim not in op.domain:
                return f"{op.label} is computed in the loop but not over {dim.name}"

        # reads
        closed: list[Edge] = []
        rows: list[Edge] = []
        arg_pos: dict[tuple, int] = {}
        other: dict[int, list[Expr]] = {}
        done: set[int] = set()
        steps: list[LoopStep] = []
        used: set[Symbol] = set()
        step_of = -1 if loop.forward else 1
        for op in ops:
            refs: list[tuple] = []
            for e in op.inputs:
                src = e.src
                if src.id in members and not _earlier_instance(e, dim):
                    if any(isinstance(i, Slice) for i in e.index):
                        return f"{op.label} reads a slice of {src.label}, computed in the loop"
                    for i, d in zip(e.index, src.domain, strict=True):
                        if d is not dim and i is not d:
                            return f"{op.label} reads {src.label} at another point of {d.name}"
                    idx = e.index[src.domain.index(dim)]
                    if idx is dim:
                        if src.id not in done:
                            return f"{op.label} reads {src.label} before it is computed"
                        refs.append(("val", src.id))
                    else:
                        other.setdefault(src.id, []).append(idx)
                        used |= symbols_of(idx)
                        refs.append(("other", src.id, idx))
                    continue
                moving = dim in symbols_of(tuple(e.index))
                if moving and any(isinstance(i, Slice) and dim in i.symbols() for i in e.index):
                    return f"{op.label} reads a slice of {src.label} that moves with {dim.name}"
                kind = "rows" if moving else "closed"
                akey = (kind, src.id, tuple(str(i) for i in e.index))
                if akey not in arg_pos:
                    group = rows if moving else closed
                    arg_pos[akey] = len(group)
                    group.append(e)
                refs.append((kind, arg_pos[akey]))
            step, needs = step_for(op, refs, shapes)
            used |= needs
            steps.append(step)
            done.add(op.id)

        # what survives the loop, from the loop's own frees
        frees: dict[int, list[Free]] = {}
        outside_frees: list[Free] = []
        for s in loop.body:
            if isinstance(s, Free):
                if s.op.id in members:
                    frees.setdefault(s.op.id, []).append(s)
                else:
                    outside_frees.append(s)
        last_index = extent - 1 if loop.forward else 0
        finals: list[Op] = []
        rows_out: list[tuple[Op, tuple[int, ...] | None]] = []
        for op in ops:
            alive = self._survivors(op, frees.get(op.id, []), dim, extent)
            if isinstance(alive, str):
                return alive
            if alive == tuple(range(extent)):
                rows_out.append((op, None))
            elif alive == (last_index,):
                finals.append(op)
            elif alive:
                rows_out.append((op, alive))
        stacked = {op.id for op, _ in rows_out}
        last: dict[int, tuple] = {}
        hist: dict[int, tuple] = {}
        shape_of = {st.op_id: (st.shape, st.dtype) for st in steps}
        for op_id, idxs in other.items():
            behind = all(isinstance(i - dim, Const) and (i - dim).value == step_of for i in idxs)
            if behind and op_id not in stacked:  # only the previous iteration's is read
                last[op_id] = shape_of[op_id]
            else:
                hist[op_id] = shape_of[op_id]
        for op_id in stacked:
            hist[op_id] = shape_of[op_id]
        derived = _derived_histories(rows_out, hist, set(other), shape_of)
        for op_id in derived:
            del hist[op_id]
        for op in finals:
            if op.id not in hist:
                last[op.id] = shape_of[op.id]
        # a value kept stacked whose last iteration is kept too is also returned on its own, so
        # reading that point (the next outer iteration's start) splits nothing out of the
        # stack: a split is one eager dispatch, and its first one compiles
        split_free = [
            op
            for op, pins in rows_out
            if op.domain[-1] is dim and (pins is None or last_index in pins)
        ]
        for op in split_free:
            last[op.id] = shape_of[op.id]
        for st in steps:
            st.refs = [
                (("hist", r[1], r[2]) if r[1] in hist else ("last", r[1])) if r[0] == "other" else r
                for r in st.refs
            ]

        used.discard(dim)
        consts: dict[Symbol, int] = {}
        symbols: list[Symbol] = []
        for s in sorted(used, key=lambda x: x.name):
            if s in bounds:
                consts[s] = int(bounds[s].value)
            elif isinstance(s, Bound):
                return f"it reads bound {s.name}, which is not static"
            else:
                symbols.append(s)
        plan = LoopPlan(
            dim=dim,
            forward=loop.forward,
            extent=extent,
            steps=steps,
            symbols=tuple(symbols),
            consts=consts,
            last=last,
            hist=hist,
            finals=tuple(op.id for op in [*finals, *split_free]),
            rows_out=tuple(op.id for op, _ in rows_out),
            derived=derived,
        )
        live = sum(nbytes_of(st.shape, st.dtype) for st in steps)
        live += sum(nbytes_of(s, d) for s, d in last.values())
        live += sum(extent * nbytes_of(s, d) for s, d in hist.values())
        return FusedLoop(
            loop, plan, ops, closed, rows, finals, rows_out, outside_frees, live_bytes=live
        )

    def _survivors(self, op: Op, frees: list[Free], dim: Dim, extent: int) -> tuple[int, ...] | str:
        """The iterations whose point of ``op`` the loop's frees leave alive (a reason if they
        are not frees of one point per iteration at a constant offset)."""
        alive = set(range(extent))
        for f in frees:
            where = op.domain.index(dim)
            if len(f.prefix) != len(op.domain) or any(
                p is not d
                for k, (p, d) in enumerate(zip(f.prefix, op.domain, strict=False))
                if k != where
            ):
                return f"{op.label} is freed other than point by point in the loop"
            off = f.prefix[where] - dim
            pins = [p.substitute(self.shapes.bounds) for p in f.pinned]
            if not isinstance(off, Const) or not all(isinstance(p, Const) for p in pins):
                return f"{op.label} is freed at a point that is not a constant offset"
            if pins and where != len(op.domain) - 1:
                return f"{op.label} is freed around pinned points of another dim"
            kept = {p.value for p in pins}
            alive -= {k + off.value for k in range(extent)} - kept
        return tuple(sorted(alive))
