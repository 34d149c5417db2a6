"""Whole loops as one compiled call, on a backend that can trace a loop (jax: ``lax.fori_loop``).

Regions (``regions.py``) cut a loop body's dispatch to one call per run of pure statements, but
Python still drives every iteration: a PPO update loop of forty minibatch steps calls its
regions forty times. A loop whose whole body can be traced runs instead as ONE call of
``backend.fuse_loop``; this module decides which loops can, plans the call (``LoopPlan``, what
the backend traces) and emits the Python around it.

A loop is fused when its bound is static, it has no ``until``, it is not the program's outer
loop (iteration hooks run between those iterations), and every statement of its body is a
compute statement that can be traced (``Fusion.why_not_traced``: no host call, no shape that
changes with the point) or a free; a nested loop keeps it out (a top-level loop holding loops
runs an iteration at a time as one call instead: ``body_regions``). ``explain()`` lists each
loop and why it was or was not fused.

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

Index expressions, guards and merge conditions are evaluated on the traced index
(``vevaluate`` over ``jax.numpy``), random keys take it as a coordinate (``counter_rng`` hashes
traced integers as it hashes Python ints, so the draws are the reference's). A merge selects
its branch with ``where`` over every branch's value: no first or last iteration is peeled,
so a loop is one trace whatever its bound. Guarded ops are computed at every iteration and
their values used only where the guard holds (a guarded-off value is never read: the program
was validated), which keeps the body one straight-line trace.

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
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from timerl.ir import prims
from timerl.ir.graph import Edge, Op
from timerl.runtime.calls import prepare_call
from timerl.schedule.program import Compute, Free, Loop
from timerl.symbolic import TRUE, Bound, Condition, Const, Dim, Expr, Slice, Symbol


@dataclass(eq=False)
class LoopStep:
    """One op of the body. ``refs``: per input, ``("val", op id)`` (this iteration),
    ``("last", op id)`` (the previous iteration's), ``("hist", op id, index)`` (any iteration
    of the loop), ``("closed", k)`` (the k-th closed-over input) or ``("rows", k)`` (the k-th
    per-iteration input, at this iteration)."""

    op_id: int
    shape: tuple[int, ...]
    dtype: np.dtype
    refs: list[tuple]
    fn: Callable[..., Any] | None = None  # None: a merge, picking among ``conds``
    kwargs: dict[str, Any] = field(default_factory=dict)
    traced: dict[str, Any] = field(default_factory=dict)  # attribute -> index expression(s)
    key: tuple | None = None  # ((seed, stream), coordinates) of a random op
    conds: tuple[Condition, ...] = ()
    multi: bool = False  # returns a tuple (``Traits.multi_output``), taken apart by tuple_get


def bind_call(step: LoopStep, op: Op, gen: Any, fusion: Any) -> set:
    """Fill in how ``step`` computes ``op`` (kernel and static attributes, or a merge's
    conditions; per-point attributes and a random key, traced); returns the symbols those
    traced parts use. Shared by a fused loop and a fused iteration (``body_regions``)."""
    rule = prims.get(op.prim)
    step.multi = rule.traits.multi_output
    used: set = set()
    if rule.traits.piecewise:
        step.conds = tuple(e.cond for e in op.inputs)
        return used | _symbols(step.conds)
    call = prepare_call(op, gen.backend, gen.seed)
    step.fn = call.fn
    for name, value in call.point_attrs:
        fixed, v = fusion._static_value(value)
        if fixed:
            step.kwargs[name] = v
        else:
            step.traced[name] = value
            used |= _symbols(value)
    if call.key is not None:
        step.key = call.key
        used |= _symbols(tuple(call.key[1]))
    return used


@dataclass(eq=False)
class LoopPlan:
    """What the backend traces: ``fn(closed, rows, symbols) -> (finals, rows_out)``."""

    dim: Dim
    forward: bool
    extent: int
    steps: list[LoopStep]
    symbols: tuple[Symbol, ...]  # the enclosing loops' indices, passed as traced ints
    consts: dict[Symbol, int]  # static bounds
    last: dict[int, tuple[tuple[int, ...], np.dtype]]  # carried: the latest value
    hist: dict[int, tuple[tuple[int, ...], np.dtype]]  # carried: every iteration's value
    finals: tuple[int, ...]  # returned: the last iteration's value
    rows_out: tuple[int, ...]  # returned: every iteration's value, as one array per iteration
    # a value of ``rows_out`` that is a contiguous view (a reshape) of another's point: no
    # history of its own, the other's history reshaped after the loop (op -> (source, shape))
    derived: dict[int, tuple[int, tuple[int, ...]]] = field(default_factory=dict)

    @property
    def parallel(self) -> bool:
        """No iteration reads another's values (nothing carried, no history read): the
        iterations may run at once, as one batched computation."""
        return all(r[0] not in ("last", "hist") for st in self.steps for r in st.refs)

    def note(self) -> str:
        """How ``explain()`` names the traced loop."""
        many = self.extent > 1 and self.parallel
        return "one vmap (iterations independent)" if many else "one XLA loop"


@dataclass(eq=False)
class LoopRegion:
    loop: Loop
    plan: LoopPlan
    ops: list[Op]
    closed: list[Edge]
    rows: list[Edge]
    finals: list[Op]
    rows_out: list[tuple[Op, tuple[int, ...] | None]]  # None: every point; else the ones kept
    outside_frees: list[Free]
    live_bytes: int


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


def _symbols(item: Any) -> frozenset:
    if isinstance(item, (tuple, list)):
        return frozenset().union(*(_symbols(x) for x in item)) if item else frozenset()
    if isinstance(item, (Expr, Condition, Slice)):
        return item.symbols()
    return frozenset()


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


def describe(loop: Loop, ops: list[Op]) -> str:
    """A loop as ``explain()`` names it: its header and the first of the user's tensors."""
    d = loop.dim
    rng = f"0 .. {d.bound.name}-1" if loop.forward else f"{d.bound.name}-1 .. 0"
    names = [o.name for o in ops if o.name and "#" not in o.name][:3] or [o.label for o in ops[:1]]
    what = f": {', '.join(names)}" if names else ""
    return f"for {d.name} in {rng} ({len(ops)} ops{what})"


def single_rows(region: LoopRegion) -> frozenset[int]:
    """The values a one-iteration loop returns stacked that its last value already holds:
    neither returned nor stored stacked (an update loop of one epoch and one minibatch)."""
    if region.plan.extent != 1:
        return frozenset()
    dim = region.loop.dim
    return frozenset(
        op.id for op, _ in region.rows_out if op.domain[-1] is dim and op.id in region.plan.finals
    )


def _nbytes(shape: tuple[int, ...], dtype: Any) -> int:
    return int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize


def _rows_or(rows: Any, gather: Callable[[], Any]) -> Any:
    return rows if rows is not None else gather()


class LoopFusion:
    """Plans and emits fused loops through a code generator and its ``Fusion``."""

    def __init__(self, fusion: Any) -> None:
        self.fusion = fusion
        self.gen = fusion.gen
        self.notes: dict[str, str] = getattr(self.gen.backend, "loop_notes", {})
        # ops whose every-iteration values a fused loop stores stacked (``stores.RowStore``)
        self.row_stores: set[int] = set()
        self._zeros: dict[tuple, Any] = {}  # one zeros array per (shape, dtype), for filler

    # --- which loops ---------------------------------------------------------------------------
    def region(self, loop: Loop, outer: Loop | None) -> LoopRegion | None:
        ops = [s.op for s in loop.body if isinstance(s, Compute)]
        found = self._plan(loop, outer, ops)
        self.notes[describe(loop, ops)] = (
            found.plan.note() if isinstance(found, LoopRegion) else f"runs in Python: {found}"
        )
        return found if isinstance(found, LoopRegion) else None

    def _plan(self, loop: Loop, outer: Loop | None, ops: list[Op]) -> LoopRegion | str:
        gen, fusion = self.gen, self.fusion
        if loop is outer:
            return "it is the program's outer loop (iteration hooks run between iterations)"
        if loop.until is not None:
            return f"it ends when {loop.until.label} holds (until)"
        bounds = fusion.bounds
        dim = loop.dim
        if dim.bound not in bounds:
            return f"its bound {dim.bound.name} is not static"
        extent = int(bounds[dim.bound].value)
        if gen.plan.allocated_by(loop):
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
            why = fusion.why_not_traced(op)
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
                        used |= _symbols(idx)
                        refs.append(("other", src.id, idx))
                    continue
                moving = dim in _symbols(tuple(e.index))
                if moving and any(isinstance(i, Slice) and dim in i.symbols() for i in e.index):
                    return f"{op.label} reads a slice of {src.label} that moves with {dim.name}"
                kind = "rows" if moving else "closed"
                akey = (kind, src.id, tuple(str(i) for i in e.index))
                if akey not in arg_pos:
                    group = rows if moving else closed
                    arg_pos[akey] = len(group)
                    group.append(e)
                refs.append((kind, arg_pos[akey]))
            shape = tuple(int(v) for v in fusion._static_shape(op.shape))
            step = LoopStep(op.id, shape, op.dtype, refs)
            used |= bind_call(step, op, gen, fusion)
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
        shapes = {st.op_id: (st.shape, st.dtype) for st in steps}
        for op_id, idxs in other.items():
            behind = all(isinstance(i - dim, Const) and (i - dim).value == step_of for i in idxs)
            if behind and op_id not in stacked:  # only the previous iteration's is read
                last[op_id] = shapes[op_id]
            else:
                hist[op_id] = shapes[op_id]
        for op_id in stacked:
            hist[op_id] = shapes[op_id]
        derived = _derived_histories(rows_out, hist, set(other), shapes)
        for op_id in derived:
            del hist[op_id]
        for op in finals:
            if op.id not in hist:
                last[op.id] = shapes[op.id]
        # a value kept stacked whose last iteration is kept too is also returned on its own, so
        # reading that point (the next outer iteration's start) splits nothing out of the
        # stack: a split is one eager dispatch, and its first one compiles
        split_free = [
            op
            for op, pins in rows_out
            if op.domain[-1] is dim and (pins is None or last_index in pins)
        ]
        for op in split_free:
            last[op.id] = shapes[op.id]
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
        live = sum(_nbytes(st.shape, st.dtype) for st in steps)
        live += sum(_nbytes(s, d) for s, d in last.values())
        live += sum(extent * _nbytes(s, d) for s, d in hist.values())
        return LoopRegion(
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
            pins = [p.substitute(self.fusion.bounds) for p in f.pinned]
            if not isinstance(off, Const) or not all(isinstance(p, Const) for p in pins):
                return f"{op.label} is freed at a point that is not a constant offset"
            if pins and where != len(op.domain) - 1:
                return f"{op.label} is freed around pinned points of another dim"
            kept = {p.value for p in pins}
            alive -= {k + off.value for k in range(extent)} - kept
        return tuple(sorted(alive))

    # --- emitting ------------------------------------------------------------------------------
    def _read_shape(self, edge: Edge) -> tuple[int, ...]:
        fusion = self.fusion
        lead = [
            int(fusion._static_value(i.stop - i.start)[1])
            for i in edge.index
            if isinstance(i, Slice)
        ]
        return (*lead, *fusion._static_shape(edge.src.shape))

    def _stacked_src(self, edge: Edge, loop: Loop, n: int) -> str | None:
        """Source handing over ``edge``'s rows for every iteration at once, where its store
        may hold them stacked (written by an earlier fused loop): None if it cannot."""
        src = edge.src
        if src.id not in self.row_stores or edge.index[-1] is not loop.dim:
            return None
        if any(loop.dim in _symbols(i) for i in edge.index[:-1]):
            return None
        if any(isinstance(i, Slice) for i in edge.index[:-1]):
            return None  # rows of several outer points (``x[0:I, t]``): gathered, not stacked
        outer = self.gen.key_src([self.gen.names.src(i) for i in edge.index[:-1]])
        return f"S{src.id}.stacked({outer}, {n})"

    def _optional_src(self, edge: Edge) -> str:
        gen = self.gen
        if edge.src.id in gen.locals:
            if edge.src.guard == TRUE:
                return f"v{edge.src.id}"
            # computed only where its guard holds: unbound (a NameError in the closure) where
            # it did not, which the loop reads as a point that does not exist
            return f"OPTIONAL(lambda: v{edge.src.id})"
        if not any(isinstance(i, Slice) for i in edge.index):
            key = gen.key_src([gen.names.src(i) for i in edge.index])
            return f"S{edge.src.id}.get({key})"
        return f"OPTIONAL(lambda: {gen.read_src(edge)})"

    def filler(self, specs: list[tuple]) -> Callable[[Any], Any]:
        """A function putting zeros (one cached array per shape) where a value is None: a
        branch or guarded input whose point does not exist at this iteration."""
        backend, zeros_cache = self.gen.backend, self._zeros

        def fill(values: Any) -> tuple:
            out = []
            for v, (shape, dtype) in zip(values, specs, strict=True):
                if v is None:
                    z = zeros_cache.get((shape, dtype))
                    if z is None:
                        z = zeros_cache[(shape, dtype)] = backend.zeros(shape, dtype)
                    v = z
                out.append(v)
            return tuple(out)

        return fill

    def rows_src(self, edge: Edge, loop: Loop, extent: int) -> str:
        """Source reading ``edge`` at every iteration of ``loop`` as one array of rows."""
        gen = self.gen
        d = gen.names.of(loop.dim)
        b = gen.names.of(loop.dim.bound)
        gen.ns.setdefault("ROWS_OR", _rows_or)
        stack = gen.const("STACK", gen.backend.stack)
        fill = gen.const("FILL", self.filler([(self._read_shape(edge), edge.src.dtype)] * extent))
        gathered = f"{stack}(list({fill}([{self._optional_src(edge)} for {d} in range({b})])))"
        whole = self._stacked_src(edge, loop, extent)
        return f"ROWS_OR({whole}, lambda: {gathered})" if whole else gathered

    def emit(self, region: LoopRegion, depth: int) -> None:
        gen = self.gen
        loop, plan = region.loop, region.plan
        backend = gen.backend
        closed_fill = gen.const(
            "FILL", self.filler([(self._read_shape(e), e.src.dtype) for e in region.closed])
        )
        rows_srcs = [self.rows_src(e, loop, plan.extent) for e in region.rows]
        closed_src = ", ".join(self._optional_src(e) for e in region.closed)
        rows_src = ", ".join(rows_srcs)
        syms_src = "".join(f"{gen.names.of(s)}, " for s in plan.symbols)
        key = (
            "loop",
            tuple(op.id for op in region.ops),
            tuple((e.src.id, tuple(str(i) for i in e.index)) for e in region.closed),
            tuple((e.src.id, tuple(str(i) for i in e.index)) for e in region.rows),
        )
        fused = gen.const("LOOP", backend.fuse_loop(key, plan))
        gen.emit(depth, f"M[0] += {region.live_bytes}")
        gen.emit(depth, "if M[0] > M[1]: M[1] = M[0]")
        gen.emit(
            depth, f"_f, _h = {fused}({closed_fill}(({closed_src}{',' if closed_src else ''})), "
        )
        gen.lines[-1] += f"({rows_src}{',' if rows_src else ''}), ({syms_src}))"
        gen.emit(depth, f"M[0] -= {region.live_bytes}")
        self.emit_results(region, depth)
        gen.emit(depth, "_f = _h = None")

    def emit_results(self, region: LoopRegion, depth: int, keep: set[int] | None = None) -> None:
        """Statement counts, stores and frees after the loop's call, from ``_f`` (the last
        iteration's values) and ``_h`` (every iteration's); ``keep``: store only these ops
        (a loop inside a fused iteration: the others die within the iteration)."""
        gen = self.gen
        loop, plan = region.loop, region.plan
        d = gen.names.of(loop.dim)
        b = gen.names.of(loop.dim.bound)

        def kept(op: Op) -> bool:
            return keep is None or op.id in keep

        # statements counted as the Python loop counts them: one per op per point computed
        unguarded = sum(1 for op in region.ops if op.guard == TRUE)
        gen.emit(depth, f"C[0] += {unguarded} * {b}")
        guarded: dict[str, int] = {}
        for op in region.ops:
            if op.guard != TRUE:
                cond = gen.names.src(op.guard)
                guarded[cond] = guarded.get(cond, 0) + 1
        # the last iteration's values (also of values stored stacked, see _plan)
        last = f"{b} - 1" if loop.forward else "0"
        finals = [op for op in region.finals if kept(op)]
        rows_out = [(op, pins) for op, pins in region.rows_out if kept(op)]
        stacked_last = {
            op.id: pins
            for op, pins in rows_out
            if op.domain[-1] is loop.dim and op.id in plan.finals
        }
        if finals or stacked_last:
            gen.emit(depth, f"if {b} > 0:")
            gen.emit(depth + 1, f"{d} = {last}")
            for op in finals:
                self._store(op, f"_f[{op.id}]", depth + 1, None, d)
            for op, pins in rows_out:
                if op.id in stacked_last:
                    self._store(op, f"_f[{op.id}]", depth + 1, pins, d)
        # every iteration's values, stored stacked (split only where a row is read alone)
        # (one iteration: its one row is the last value, stored on its own above)
        rows_out = [(op, pins) for op, pins in rows_out if op.id not in single_rows(region)]
        for op, pins in rows_out:
            if op.domain[-1] is not loop.dim:
                continue  # stored row by row below
            self.row_stores.add(op.id)
            conds = [gen.names.src(op.guard)] if op.guard != TRUE else []
            if pins:
                conds.append(f"{d} in {gen.const('KEPT', frozenset(pins))}")
            if op.id in stacked_last:  # stored on its own above
                conds.append(f"{d} != {last}")
            where = f" if {' and '.join(conds)}" if conds else ""
            outer = gen.key_src([gen.names.of(x) for x in op.domain[:-1]])
            # (a derived history is its source's memory, reshaped; the meter still counts
            # it as its own, as before it was derived: an over-count on this backend)
            shape, dtype = plan.hist.get(op.id) or (plan.derived[op.id][1], op.dtype)
            row = _nbytes(shape, dtype)
            gen.emit(depth, f"_ks = [{d} for {d} in range({b}){where}]")
            gen.emit(depth, f"S{op.id}.put_rows({outer}, _h[{op.id}], _ks, {row})")
            gen.emit(depth, f"M[0] += len(_ks) * {row}")
            gen.emit(depth, "if M[0] > M[1]: M[1] = M[0]")
        # every iteration's: surviving points, statement counts, frees of outside values (a
        # free whose points do not move with the loop frees them once: emitted once, after)
        moving = [f for f in region.outside_frees if loop.dim in _symbols((f.prefix, f.pinned))]
        once = [f for f in region.outside_frees if all(f is not m for m in moving)]
        rest = [op for op, _ in rows_out if op.id not in self.row_stores]
        if rest or guarded or moving:
            gen.emit(depth, f"for {d} in range({b}):")
            for cond, n in guarded.items():
                gen.emit(depth + 1, f"if {cond}: C[0] += {n}")
            for op, pins in rows_out:
                if op.id not in self.row_stores:
                    self._store(op, f"_h[{op.id}][{d}]", depth + 1, pins, d)
            for stmt in moving:
                gen.free(stmt, depth + 1)
            gen.emit(depth + 1, "pass")
        if once:
            gen.emit(depth, f"if {b} > 0:")
            for stmt in once:
                gen.free(stmt, depth + 1)

    def _store(self, op: Op, value: str, depth: int, pins: tuple[int, ...] | None, d: str) -> None:
        gen = self.gen
        conds = []
        if op.guard != TRUE:
            conds.append(gen.names.src(op.guard))
        if pins:
            conds.append(f"{d} in {gen.const('KEPT', frozenset(pins))}")
        if conds:
            gen.emit(depth, f"if {' and '.join(conds)}:")
            depth += 1
        point = gen.key_src([gen.names.of(x) for x in op.domain])
        gen.emit(depth, f"v{op.id} = {value}")
        gen.emit(depth, f"S{op.id}[{point}] = v{op.id}")
        gen.alloc(op, depth, f"v{op.id}")
        gen.drop_stored(op, depth, f"v{op.id}")
