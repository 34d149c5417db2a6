"""What each schedule statement means: the source that runs it, one emitter per kind.

Every statement kind is defined once, here, as the Python source the code generator emits
for it (``codegen.CodeGen`` mixes these emitters in): a ``Compute`` calls its kernel (or picks
a merge's branch) and stores the value, a point or a block's row, and counts its bytes; a
``Free`` drops points or blocks and counts their bytes out; ``SwapOut``/``SwapIn`` move a
block or points to disk and back; ``Start`` begins a host call; a ``Loop`` allocates its
blocks, runs its body over its points (to the first point where ``until`` holds, recording
the length it reached, which a later loop over the stop's other dims takes again) and calls
the iteration hooks of the outer loop. The fusion pass's statements (``schedule/fused.py``)
mean the statements they wrap, and their emitters (``regions.py``, ``loop_regions.py``,
``body_regions.py``) call these for the statements they run around their call.

Both ways a program runs use these emitters: the generated code (``compiled=True``), and the
reference it is tested against (``compiled=False``, ``CodeGen(reference=True)``), which
emits the schedule's own statements each on its own: every value in its store, no read
hoisted before a loop, no meter changes summed, no guard kept in a local, no fused call. So
the interpreter is "generate and run" too, and no statement kind is implemented twice. Why
not the other way round (an interpreter calling one handler object per statement, which the
code generator would call too): a call per statement and its environment lookups cost more
than the numpy kernels of an RL-sized program (the reason the generator exists), and a
handler that emitted source beside its interpreting closure would be the two
implementations again. What the reference gives up is its own evaluation of each
statement: it now shares these emitters with the generated code, and what it checks is
every optimisation the generator makes over them (and the compiler's, ``optimize=False``).
Generating costs a compile of the run function's source once per executor.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import numpy as np

from timerl.ir import prims
from timerl.ir.graph import Op
from timerl.memory.donation import copies_branch
from timerl.runtime.calls import META_ATTRS, host_call, prepare_call
from timerl.schedule.fused import FusedBody, FusedStmt
from timerl.schedule.program import Free, Loop, SwapIn, SwapOut
from timerl.symbolic import TRUE, Const, Dim

UNBOUNDED = 2**62  # a dynamic bound while its loop runs: range guards see an unbounded dim


class Statements:
    """The emitters, one per statement kind, mixed into ``codegen.CodeGen`` (whose
    ``emit``, ``const``, ``names``, ``read_src``, ``cond``, ``plan`` and the rest they use)."""

    # --- Compute -------------------------------------------------------------------------------
    def compute(self, op: Op, depth: int) -> None:
        """``op`` at its point, where its guard holds: its kernel's value (or the branch a
        merge picks, an alias's row marked) stored at the point (or written into its row of
        a block), its bytes counted in, the statement counted."""
        var = f"v{op.id}"
        point = self.key_src([self.names.of(d) for d in op.domain])
        body_depth = depth
        if op.guard != TRUE:
            self.emit(depth, f"if {self.cond(op.guard, depth)}:")
            body_depth += 1
        if op.id in self.trim_before:
            self.emit(body_depth, "TRIM()")
        if op.id in self.plan.aliases:
            # its rows are its base block's: nothing to compute, its point marked written
            self._block_write(op, var, body_depth)
        elif self.plan.writes_row(op, self.backend):
            # the kernel writes the row; no local keeps it (a view would keep the block alive)
            row, mark = self._row_to_write(op)
            self.call(op, body_depth, var, point, row=row)
            self.emit(body_depth, mark)
        else:
            if prims.get(op.prim).traits.piecewise:
                self.merge(op, body_depth, var, broadcast=not self._row_broadcasts(op))
            else:
                self.call(op, body_depth, var, point)
            self.store(op, var, body_depth)
        n = self.plan.read_bytes.get(op.id)
        if n:  # the peak with the chunks its kernel reads a streamed block into
            self.emit(body_depth, f"if M[0] + {n} > M[1]: M[1] = M[0] + {n}")
        self._count(body_depth)

    def store(self, op: Op, var: str, depth: int) -> None:
        """The value of ``op`` at its point, in ``var``, put where it lives (its store, its
        row of a block, or the local itself) and its bytes counted in: the end of a compute
        statement, also where a fused call computed it (``regions.py``, ``loop_regions.py``,
        ``body_regions.py``)."""
        if op.id in self.plan.blocks:
            self._block_write(op, var, depth)
        elif op.id not in self.locals:
            point = self.key_src([self.names.of(d) for d in op.domain])
            self.emit(depth, f"S{op.id}[{point}] = {var}")
        self.alloc(op, depth, var)
        self.drop_stored(op, depth, var)

    def merge(self, op: Op, depth: int, var: str, broadcast: bool = True) -> None:
        shape_src = self.key_src([self.names.src(s) for s in op.shape])
        # the first branch's test may become a local; the later ones stay inline (evaluated
        # only when reached, as the chain would)
        for k, e in enumerate(op.inputs):
            kw = "if" if k == 0 else "elif"
            test = self.cond(e.cond, depth) if k == 0 else self.names.src(e.cond)
            self.emit(depth, f"{kw} {test}:")
            value = self.read_src(e)
            if copies_branch(op, e, self.owned):
                # a donation writes into this merge's value: give it a buffer of its own
                copy = self.const("COPY", self.backend.copy)
                value = f"{copy}({self._broadcast_src(op, value, shape_src)})"
            self.emit(depth + 1, f"{var} = {value}")
        self.emit(depth, "else:")
        err = self.const("UNDEF", f"{op.where()} has no definition at this point")
        self.emit(depth + 1, f"raise MISSING({err})")
        if not broadcast:
            return
        self.emit(depth, f"{var} = {self._broadcast_src(op, var, shape_src)}")

    def _broadcast_src(self, op: Op, value: str, shape_src: str) -> str:
        """``value`` broadcast to ``op``'s shape and cast to its dtype."""
        bc = self.const("BCAST", self.backend.broadcast)
        return f"{bc}({value}, {shape_src}, {self.const('DT', op.dtype)})"

    def call(self, op: Op, depth: int, var: str, point: str, row: str | None = None) -> None:
        """``var = kernel(...)``; with ``row`` (the source of a block's row), ``kernel(...,
        out=row)`` and no ``var``."""
        donate = self.donations.get(op.id)
        if donate is None and row is None and not self.reference and self._inline(op, depth, var):
            return
        call = prepare_call(op, self.backend, self.seed, donate, row=row is not None)
        # (the reference keeps a host call's results the backend's arrays)
        numpy_results = getattr(self.backend, "host_results_numpy", False) and not self.reference
        if op.id in self.host_only or (prims.get(op.prim).traits.host and numpy_results):
            call = replace(call, fn=host_call(op, self.backend, native=False))
        args = [self.read_src(e) for e in op.inputs]
        if donate is not None and op.inputs[donate].src.id not in self.locals:
            # take the point out of the donor's store: the free after this finds nothing
            e = op.inputs[donate]
            key = self.key_src([self.names.src(i) for i in e.index])
            self.emit(depth, f"_d = S{e.src.id}.pop({key})")
            # every operand reading that same point reads it from there (``x * x``)
            args = ["_d" if a == args[donate] else a for a in args]
        fn = self.const("K", call.fn)
        if call.pass_point:
            args.append(point)
        kwargs = []
        for name, value in call.point_attrs:
            if isinstance(value, (tuple, list)):
                kwargs.append(f"{name}={self.key_src([self._attr_src(v) for v in value])}")
            else:
                kwargs.append(f"{name}={self._attr_src(value)}")
        if call.key is not None:
            (seed, stream), coords = call.key
            items = [str(seed), str(stream), *(self._attr_src(c) for c in coords)]
            kwargs.append(f"key={self.key_src(items)}")
        if donate is not None:
            kwargs.append(f"out={args[donate]}")
        if row is not None:
            kwargs.append(f"out={row}")
        where = op.where().replace("\n", " ")
        target = "" if row is not None else f"{var} = "
        self.emit(depth, f"{target}{fn}({', '.join(args + kwargs)})  # {where}")
        if "_d" in args:
            self.emit(depth, "_d = None")  # the result holds the buffer; this name must not

    def _inline(self, op: Op, depth: int, var: str) -> bool:
        """``var = expression``, where the backend writes ``op`` inline (a subscript): no
        kernel call, its frame and keywords (``Backend.inline_lowerings``)."""
        rule = self.backend.inline_rule(op)
        if rule is None:
            return False
        per_point = set(prims.get(op.prim).point_attrs)
        attrs = {
            k: self._attr_src(v) if k in per_point or not isinstance(v, int) else repr(v)
            for k, v in op.attrs.items()
            if k not in META_ATTRS
        }
        src = rule(*[self.read_src(e) for e in op.inputs], **attrs)
        self.emit(depth, f"{var} = {src}  # {op.where().replace(chr(10), ' ')}")
        return True

    def _row_broadcasts(self, op: Op) -> bool:
        """Whether ``op``'s value goes straight into its row of a block in memory, whose
        assignment broadcasts and casts it as the merge would (a streamed block's rows, a
        ring's and an alias's are written otherwise)."""
        plan = self.plan
        return (
            op.id in plan.blocks
            and op.id not in plan.rings
            and op.id not in plan.aliases
            and not plan.storage[op.id].streamed
        )

    def alloc(self, op: Op, depth: int, var: str) -> None:
        if op.id in self.plan.blocks or op.id in self.plan.views:
            return  # a row of a block allocated with its loop, or a view of one
        if op.id in self.donations:
            return  # written into a dead input's buffer: those bytes were counted
        n = _static_nbytes(op)
        if n is not None:
            self._tally(depth, n, peak=op.id not in self.quiet)
            return
        self.emit(depth, f"M[0] += NB({var})")
        self.emit(depth, "if M[0] > M[1]: M[1] = M[0]")

    def drop_stored(self, op: Op, depth: int, var: str) -> None:
        """Drop the local of a value just put in its store or copied into its block's row:
        readers read the store or the block, and a local left behind would keep the value
        alive after its free, until the next point reassigns it (a parameter-sized array an
        iteration; the last observation a rollout wrote into its block, through the whole
        update; both unseen by the meter)."""
        if op.id not in self.locals:
            self.emit(depth, f"{var} = None")

    # --- Free -----------------------------------------------------------------------------------
    def free(self, stmt: Free, depth: int) -> None:
        """The points of ``stmt.op`` under its prefix dropped (all of them without one, not
        the pinned ones; a block whole), their bytes counted out."""
        self._free(stmt, depth)
        op = stmt.op
        if all(p is d for p, d in zip(stmt.prefix, op.domain, strict=False)):
            # The point just computed is among those freed: drop the generated code's own
            # reference too, or a batch-sized value would live on until it is next assigned.
            self.emit(depth, f"v{op.id} = None")

    def _free(self, stmt: Free, depth: int) -> None:
        op = stmt.op
        if op.id in self.plan.blocks:
            key = self.key_src([self.names.src(p) for p in stmt.prefix])
            if stmt.pinned:  # (an alias only: a block is never freed around pinned points)
                pins = self.key_src([self.names.src(p) for p in stmt.pinned])
                self.emit(depth, f"if {self.names.src(stmt.prefix[-1])} not in {pins}:")
                depth += 1
            self._block_free(stmt, key, depth)
            return
        n = 0 if op.id in self.plan.views else _static_nbytes(op)
        if op.id in self.locals:
            if op.id in self.donors:
                return  # its one point was handed to the op that wrote into it
            size = n if n is not None else f"NB(v{op.id})"
            if op.guard != TRUE:  # a local is freed at its own point, so where it was computed
                self.emit(depth, f"if {self.cond(op.guard, depth)}: M[0] -= {size}")
            elif n is not None:
                self._tally(depth, -n)
            else:
                self.emit(depth, f"M[0] -= {size}")
            return
        view = "_VIEW" if op.id in self.plan.views else ""  # a view's values hold no bytes
        if n is not None and not view and not prims.get(op.prim).traits.multi_output:
            # every point holds the same bytes: counted, not measured
            view, tail = "_N", f", {n}"
        else:
            tail = ""
        if not stmt.prefix:
            # inside a loop it runs at every iteration, most often with nothing left to free
            # (tested on the plain dicts of numpy and torch; fused loops' stores are left be)
            test = f"if S{op.id}: " if self.regions is None else ""
            self.emit(depth, f"{test}FREE_ALL{view}(S{op.id}, M{tail})")
            return
        key = self.key_src([self.names.src(p) for p in stmt.prefix])
        if stmt.pinned:
            pins = self.key_src([self.names.src(p) for p in stmt.pinned])
            self.emit(depth, f"if {self.names.src(stmt.prefix[-1])} not in {pins}:")
            depth += 1
        if len(stmt.prefix) == len(op.domain):
            # no name of the generated code may hold the freed value after this line
            if n is not None:
                self.emit(depth, f"if S{op.id}.pop({key}, None) is not None: M[0] -= {n}")
            else:
                self.emit(depth, f"_x = S{op.id}.pop({key}, None)")
                self.emit(depth, "if _x is not None: M[0] -= NB(_x)")
                self.emit(depth, "_x = None")
        else:
            self.emit(depth, f"FREE_PREFIX{view}(S{op.id}, {key}, M{tail})")

    # --- SwapOut, SwapIn, Start ---------------------------------------------------------------
    def swap(self, stmt: SwapOut | SwapIn, depth: int) -> None:
        """Write a block (or a point store's points) under the prefix to disk and release
        it, or read it back; nothing where the op is held as points this backend keeps."""
        key = self.key_src([self.names.src(p) for p in stmt.prefix])
        op_id = stmt.op.id
        if op_id in self.plan.swapped_points:
            if isinstance(stmt, SwapOut):
                self.emit(depth, f"M[0] -= S{op_id}.swap_out({key})")
            else:
                self.emit(depth, f"M[0] += S{op_id}.swap_in({key})")
                self.emit(depth, "if M[0] > M[1]: M[1] = M[0]")
            return
        if op_id not in self.plan.blocks:
            return  # held as points on this backend: nothing to swap
        if isinstance(stmt, SwapOut):
            # ``_b`` (the block a loop wrote last) must not keep the swapped block alive
            self.emit(depth, "_b = None")
            self.emit(depth, f"M[0] -= S{op_id}.swap_out({key})")
            return
        self.emit(depth, f"M[0] += S{op_id}.swap_in({key})")
        self.emit(depth, "if M[0] > M[1]: M[1] = M[0]")

    def start(self, op: Op, depth: int) -> None:
        """Start ``op``'s host call in the background; its compute later waits for it."""
        if op.guard != TRUE:
            self.emit(depth, f"if {self.names.src(op.guard)}:")
            depth += 1
        begin = self.const("K", host_call(op, self.backend, "begin"))
        self.emit(depth, f"{begin}({', '.join(self.read_src(e) for e in op.inputs)})")

    # --- Loop -----------------------------------------------------------------------------------
    def loop(self, loop: Loop, depth: int, outer: FusedStmt | None) -> None:
        """A loop run in Python; ``outer``: the loop iteration hooks run between the
        iterations of (``CTL``), None without hooks."""
        self.allocate_blocks(loop, depth)
        d = self.names.of(loop.dim)
        b = self.names.of(loop.dim.bound)
        if loop is outer:
            self.emit(depth, "CTL.before()")
            self.emit(depth, f"for {d} in range(CTL.start, {b}):")
            self._recorded_lengths(loop.dim, depth + 1)
            self.body(loop.body, depth + 1, outer)
            self.emit(depth + 1, f"CTL.after({d})")
            return
        if loop.until is None:
            rng = f"range({b})" if loop.forward else f"range({b} - 1, -1, -1)"
            # (reads it does not change, read once before it: not in the reference, nor where
            # fused statements read their own sources)
            hoists = self.regions is None and not self.reference
            frame = self._enter(loop) if hoists else None
            self.emit(depth, f"for {d} in {rng}:")
            self._recorded_lengths(loop.dim, depth + 1)
            self.body(loop.body, depth + 1, outer)
            if frame is not None:
                self._leave(frame, depth)
            return
        done = loop.until
        self.emit(depth, f"_cap = CTL.caps.get({self.const('BOUND', loop.dim.bound)})")
        self.emit(depth, f"{b} = {UNBOUNDED} if _cap is None else _cap")
        self.emit(depth, f"{d} = 0")
        self.emit(depth, "while True:")
        self.body(loop.body, depth + 1, outer)
        point = self.key_src([self.names.of(x) for x in done.domain])
        read = f"v{done.id}" if done.id in self.locals else f"S{done.id}[{point}]"
        self.emit(depth + 1, f"if TRUTH({read}):")
        self.emit(depth + 2, f"{b} = {d} + 1")
        self.emit(depth + 2, "break")
        self.emit(depth + 1, f"if _cap is not None and {d} + 1 >= _cap:")
        self.emit(depth + 2, f"{b} = _cap")
        self.emit(depth + 2, "break")
        self.emit(depth + 1, f"{d} += 1")
        outer_pt = self.key_src([self.names.of(x) for x in done.domain if x is not loop.dim])
        self.emit(depth, f"CTL.lengths[{self.const('BOUND', loop.dim.bound)}][{outer_pt}] = {b}")

    def _recorded_lengths(self, dim: Dim, depth: int) -> None:
        """Take the lengths ``until`` set at this point of ``dim`` again
        (``Schedule.ragged_lengths``): a loop over ``i`` after the stop's reads each ``i``'s."""
        for bound, dims in self._ragged.get(dim, ()):
            b = self.names.of(bound)
            lengths = f"CTL.lengths[{self.const('BOUND', bound)}]"
            point = self.key_src([self.names.of(x) for x in dims])
            self.emit(depth, f"{b} = {lengths}.get({point}, {b})")

    def _fused_iterations(self, body: FusedBody, depth: int, outer: FusedStmt | None) -> None:
        """A loop run in Python whose every iteration is one compiled call."""
        loop = body.loop
        d = self.names.of(loop.dim)
        b = self.names.of(loop.dim.bound)
        if body is outer:
            self.emit(depth, "CTL.before()")
            self.emit(depth, f"for {d} in range(CTL.start, {b}):")
        else:
            rng = f"range({b})" if loop.forward else f"range({b} - 1, -1, -1)"
            self.emit(depth, f"for {d} in {rng}:")
        self._recorded_lengths(loop.dim, depth + 1)
        self.bodies.emit(body, depth + 1)
        if body is outer:
            self.emit(depth + 1, f"CTL.after({d})")

    # --- blocks: allocated by their loop, written and freed whole ---------------------------------
    def allocate_blocks(self, loop: Loop, depth: int) -> None:
        """The blocks ``loop`` allocates before it starts, at the enclosing point."""
        plan = self.plan
        for op in plan.allocated_by(loop):
            outer = self.key_src([self.names.of(d) for d in op.domain[:-1]])
            if op.id in plan.aliases:
                self.emit(depth, f"S{op.id}.share({outer}, S{op.inputs[0].src.id})")
                continue
            self.emit(depth, f"M[0] += S{op.id}.allocate({outer})")
            self.emit(depth, "if M[0] > M[1]: M[1] = M[0]")

    def _row_of(self, op: Op) -> tuple[str, str, str]:
        """Sources of ``op``'s block at its point, the row its point goes in and what marks
        the point written there: row ``last`` and ``True`` in a block; in a ring row ``last mod
        rows``, which records the point it holds."""
        outer = op.domain[:-1]
        block = self._block_entry(
            op.id, self.key_src([self.names.of(d) for d in outer]), frozenset(outer)
        )
        last = self.names.of(op.domain[-1])
        if op.id in self.plan.rings:
            return block, f"{last} % {self.plan.storage[op.id].extent}", last
        return block, last, "True"

    def _block_write(self, op: Op, var: str, depth: int) -> None:
        block, row, mark = self._row_of(op)
        if op.id in self.plan.aliases:  # the row is already there: its base's row, reshaped
            self.emit(depth, f"{block}[1][{row}] = {mark}")
            return
        self.emit(depth, f"_b = {block}")
        self.emit(depth, f"_b[0][{row}] = {var}")
        self.emit(depth, f"_b[1][{row}] = {mark}")

    def _row_to_write(self, op: Op) -> tuple[str, str]:
        """The row a kernel writes ``op``'s point into (``StorePlan.writes_row``), and the
        line that then marks the point written."""
        block, row, mark = self._row_of(op)
        return self._row_of_entry(block, row), f"{block}[1][{row}] = {mark}"

    def _block_free(self, stmt: Free, key: str, depth: int) -> None:
        op_id = stmt.op.id
        if op_id in self.plan.rings and len(stmt.prefix) == len(stmt.op.domain):
            self.emit(depth, f"S{op_id}.pop({key})")  # one point: the ring keeps its rows
            return
        # ``_b`` (the block a loop wrote last) must not keep a freed block alive
        self.emit(depth, "_b = None")
        if not stmt.prefix:
            self.emit(depth, f"M[0] -= S{op_id}.free_all()")
        else:
            self.emit(depth, f"M[0] -= S{op_id}.free_prefix({key})")


def _static_nbytes(op: Op) -> int | None:
    # a pure multi-output op counts its declared (nominal) size: its parts' bytes are counted
    # by their tuple_get readers, which hold the very arrays
    if prims.get(op.prim).traits.host:
        # a host function's result is whatever it returns, measured at each call, unless its
        # author declared the size (an env step's parts: the meter's own ``NB`` of three
        # arrays was 2-3% of a CartPole rollout step)
        return op.attrs.get("result_nbytes")
    if not all(isinstance(s, Const) for s in op.shape):
        return None
    return int(np.prod([s.value for s in op.shape], dtype=np.int64)) * op.dtype.itemsize


def _no_bytes(value: Any) -> int:
    return 0


def _free_all(store: dict, meter: list, nbytes: Callable[[Any], int]) -> None:
    for value in store.values():
        meter[0] -= nbytes(value)
    store.clear()


def _free_all_n(store: dict, meter: list, n: int) -> None:
    """``_free_all`` of an op whose every point holds ``n`` bytes (a static shape)."""
    meter[0] -= n * len(store)
    store.clear()


def _free_prefix_n(store: dict, key: tuple, meter: list, n: int) -> None:
    """``_free_prefix`` of an op whose every point holds ``n`` bytes: no array is measured
    (a jax array's size is a Python property call; the body of a PPO iteration frees fifty)."""
    whole = getattr(store, "pop_prefix", None)
    if whole is not None:
        meter[0] -= whole(key, lambda _: n)
        return
    k = len(key)
    points = [p for p in store if p[:k] == key]
    for point in points:
        del store[point]
    meter[0] -= n * len(points)


def _free_prefix(store: dict, key: tuple, meter: list, nbytes: Callable[[Any], int]) -> None:
    whole = getattr(store, "pop_prefix", None)  # a RowStore drops its stacked rows at once
    if whole is not None:
        meter[0] -= whole(key, nbytes)
        return
    n = len(key)
    for point in [p for p in store if p[:n] == key]:
        meter[0] -= nbytes(store.pop(point))


def runtime_names(backend: Any) -> dict[str, Any]:
    """What the emitted statements call by name in the generated code's namespace."""
    return dict(
        NB=backend.nbytes,
        TRUTH=backend.truth,
        FREE_ALL=functools.partial(_free_all, nbytes=backend.nbytes),
        FREE_PREFIX=functools.partial(_free_prefix, nbytes=backend.nbytes),
        FREE_ALL_VIEW=functools.partial(_free_all, nbytes=_no_bytes),
        FREE_PREFIX_VIEW=functools.partial(_free_prefix, nbytes=_no_bytes),
        FREE_ALL_N=_free_all_n,
        FREE_PREFIX_N=_free_prefix_n,
    )
