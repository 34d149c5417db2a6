"""Fused loops (``schedule/fused.FusedLoop``) emitted as one compiled call of the backend.

``compiler/fusion_loops.py`` decides which loops run as one call and plans what the backend
traces (``LoopPlan``); here the code generator's source around the call is written: the
values read before it (once, or at every iteration, as one array of rows), the call
(``backend.fuse_loop``, its plan's kernels bound for the backend by ``bind_steps``), then the
statement counts, the points the loop's frees leave alive written to their stores (every
iteration's as one array, held by a ``RowStore`` that splits a row out only when it is read
alone), and the frees of values from outside the loop replayed. Statements counted and live
bytes after the loop equal the Python loop's.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

from timerl.ir.graph import Edge, Op
from timerl.runtime.calls import prepare_call
from timerl.schedule.fused import BodyPlan, FusedLoop, LoopPlan, LoopStep, nbytes_of
from timerl.schedule.program import Loop
from timerl.symbolic import TRUE, Condition, Expr, Slice


def bind_steps(plan: Any, ops: dict[int, Op], backend: Any, seed: int) -> Any:
    """``plan`` (a ``LoopPlan`` or ``BodyPlan``) with each step's kernel and random key bound
    for ``backend``: what its traced function calls."""
    if isinstance(plan, BodyPlan):
        items = [
            _bound(st, ops, backend, seed) if isinstance(st, LoopStep) else st for st in plan.items
        ]
        loops = [
            replace(nest, plan=bind_steps(nest.plan, ops, backend, seed)) for nest in plan.loops
        ]
        return replace(plan, items=items, loops=loops)
    assert isinstance(plan, LoopPlan)
    return replace(plan, steps=[_bound(st, ops, backend, seed) for st in plan.steps])


def _bound(step: LoopStep, ops: dict[int, Op], backend: Any, seed: int) -> LoopStep:
    if step.merge:
        return step
    call = prepare_call(ops[step.op_id], backend, seed)
    return replace(step, fn=call.fn, key=call.key)


def _symbols_of(item: Any) -> frozenset:
    if isinstance(item, (tuple, list)):
        return frozenset().union(*(_symbols_of(x) for x in item)) if item else frozenset()
    if isinstance(item, (Expr, Condition, Slice)):
        return item.symbols()
    return frozenset()


def _rows_or(rows: Any, gather: Callable[[], Any]) -> Any:
    return rows if rows is not None else gather()


class LoopEmitter:
    """Emits fused loops through a code generator (its ``RegionEmitter`` is ``gen.regions``)."""

    def __init__(self, gen: Any) -> None:
        self.gen = gen
        # ops whose every-iteration values a fused loop stores stacked (``stores.RowStore``)
        self.row_stores: set[int] = set()
        self._zeros: dict[tuple, Any] = {}  # one zeros array per (shape, dtype), for filler

    def _read_shape(self, edge: Edge) -> tuple[int, ...]:
        """The static shape of what ``edge`` reads (a slice's rows first)."""
        return self.gen.regions._read_shape(edge)

    def _stacked_src(self, edge: Edge, loop: Loop, n: int) -> str | None:
        """Source handing over ``edge``'s rows for every iteration at once, where its store
        may hold them stacked (written by an earlier fused loop): None if it cannot."""
        src = edge.src
        if src.id not in self.row_stores or edge.index[-1] is not loop.dim:
            return None
        if any(loop.dim in _symbols_of(i) for i in edge.index[:-1]):
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

    def emit(self, region: FusedLoop, depth: int) -> None:
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
        bound = bind_steps(plan, gen.ops, backend, gen.seed)
        fused = gen.const("LOOP", backend.fuse_loop(key, bound))
        gen.emit(depth, f"M[0] += {region.live_bytes}")
        gen.emit(depth, "if M[0] > M[1]: M[1] = M[0]")
        gen.emit(
            depth, f"_f, _h = {fused}({closed_fill}(({closed_src}{',' if closed_src else ''})), "
        )
        gen.lines[-1] += f"({rows_src}{',' if rows_src else ''}), ({syms_src}))"
        gen.emit(depth, f"M[0] -= {region.live_bytes}")
        self.emit_results(region, depth)
        gen.emit(depth, "_f = _h = None")

    def emit_results(self, region: FusedLoop, depth: int, keep: set[int] | None = None) -> None:
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
        rows_out = [(op, pins) for op, pins in rows_out if op.id not in region.single_rows()]
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
            row = nbytes_of(shape, dtype)
            gen.emit(depth, f"_ks = [{d} for {d} in range({b}){where}]")
            gen.emit(depth, f"S{op.id}.put_rows({outer}, _h[{op.id}], _ks, {row})")
            gen.emit(depth, f"M[0] += len(_ks) * {row}")
            gen.emit(depth, "if M[0] > M[1]: M[1] = M[0]")
        # every iteration's: surviving points, statement counts, frees of outside values (a
        # free whose points do not move with the loop frees them once: emitted once, after)
        moving = [f for f in region.outside_frees if loop.dim in _symbols_of((f.prefix, f.pinned))]
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
        gen.emit(depth, f"v{op.id} = {value}")
        # (a value kept in a local never outlives its iteration: here it is always stored)
        gen.store(op, f"v{op.id}", depth)
