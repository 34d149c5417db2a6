"""Compile a whole schedule into one generated Python function.

The interpreter in ``executor.py`` pays, per statement, for dict lookups of symbol values,
calls of compiled index lambdas, closures and generic bookkeeping — more than the numpy
kernels themselves cost on RL-sized arrays. Here every loop becomes a Python ``for``/``while``
over local ints, every index expression is inlined source, every kernel is a namespace
constant with its static attributes bound, and a value that is only read at the same point
inside the same loop iteration lives in a local variable instead of a store. Memory accounting
is kept exact: sizes known at compile time are inlined as constants.

The interpreter stays as the reference this is tested against.
"""

from __future__ import annotations

import functools
import itertools
import linecache
import re
import weakref
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from timerl.compiler.donation import aliasing_merges, copies_branch, owned_merges
from timerl.errors import BoundError, UndefinedPointError
from timerl.ir import prims
from timerl.ir.graph import Edge, Op
from timerl.runtime.body_regions import BodyEmitter
from timerl.runtime.calls import (
    META_ATTRS,
    element_shape,
    gather_points,
    host_call,
    prepare_call,
)
from timerl.runtime.heap import compile_apart, trim_before_peak
from timerl.runtime.loop_regions import LoopEmitter
from timerl.runtime.regions import RegionEmitter
from timerl.runtime.stores import RowStore, StorePlan
from timerl.schedule.fused import FusedBody, FusedLoop, FusedStmt, Region
from timerl.schedule.program import Compute, Free, Loop, Schedule, Start, Stmt, SwapIn, SwapOut
from timerl.symbolic import TRUE, Bound, Condition, Const, Dim, Expr, Slice, Symbol

UNBOUNDED = 2**62
_SOURCES = itertools.count()  # numbers the generated sources registered in linecache
# how the file name of a generated source starts (tracebacks show it; tools find it by it)
GENERATED_FILE = "<timerl schedule"


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


def _missing(label: str) -> Callable[[tuple], Any]:
    def raise_missing(key: tuple) -> Any:
        raise UndefinedPointError(
            f"{label} at {key} is not available: it was never computed or already freed "
            "(this is a scheduling bug; please report it with the program)"
        )

    return raise_missing


class _Names:
    def __init__(self) -> None:
        self.sym: dict[Symbol, str] = {}
        self.counter = itertools.count()

    def of(self, s: Symbol) -> str:
        if s not in self.sym:
            kind = "b" if isinstance(s, Bound) else "d"
            self.sym[s] = f"{kind}{next(self.counter)}_{''.join(c for c in s.name if c.isalnum())}"
        return self.sym[s]

    def src(self, item: Expr | Condition) -> str:
        for s in item.symbols():
            self.of(s)
        return item.source(self.sym)


_READS_METER = re.compile(r"\bM\b")  # a line that reads or changes the live-bytes meter


@dataclass(eq=False)
class _Hoist:
    """A loop being emitted: what its body changes, and the reads it makes once before it."""

    loop: Loop
    at: int  # where in the generated lines the loop starts
    points: set[int] = field(default_factory=set)  # point stores written, freed or swapped
    blocks: set[int] = field(default_factory=set)  # blocks allocated, freed or swapped
    reads: dict[tuple[str, str], str] = field(default_factory=dict)
    lines: list[str] = field(default_factory=list)


class CodeGen:
    """Generates ``run(stores, meter, ctl)`` for one schedule on one backend.

    ``body``: the statements run, the fusion pass's included (``schedule/fused.py``; by
    default the schedule's own), each emitted as it says."""

    def __init__(
        self,
        schedule: Schedule,
        ops: list[Op],
        backend: Any,
        seed: int,
        keep: set[int],
        storage: Mapping[int, Any] | None = None,
        donations: Mapping[int, int] | None = None,
        trim_before: frozenset[int] = frozenset(),
        body: list[FusedStmt] | None = None,
    ) -> None:
        self.schedule = schedule
        self.stmts = list(schedule.body if body is None else body)
        self._ragged = schedule.ragged_lengths()
        self.plan = StorePlan(schedule, storage or {}, self.stmts)
        self.trim_before = trim_before  # ops before which ``heap.trim_before_peak`` runs
        # op id -> input position it writes into; a donor's point leaves its store there
        self.donations = dict(donations or {})
        by_id = {op.id: op for op in ops}
        self.donors = {by_id[i].inputs[k].src.id for i, k in self.donations.items()}
        self.owned = owned_merges(self.donations, by_id)
        self.quiet = aliasing_merges(ops, self.owned)  # merges that allocate nothing
        self.ops = {op.id: op for op in ops}
        self.backend = backend
        self.seed = seed
        self.keep = keep
        self.names = _Names()
        self.bounds: dict[Bound, Const] = {}  # the static bounds, as constants
        self.ns: dict[str, Any] = {
            "MISSING": UndefinedPointError,
            "BoundError": BoundError,
            "np": np,
            "TRIM": trim_before_peak,
        }
        self.lines: list[str] = []
        # per loop body being emitted (outermost first): its statements' depth and the guard
        # conditions it has evaluated into locals (see ``cond``)
        self._conds: list[tuple[int, dict[str, str]]] = []
        self._cond_names = itertools.count()
        self._static: set[Bound] = set()
        self.read_through: Callable[[Edge, str], str] | None = None
        self._reads: dict[tuple, str] = {}  # (op id, index) -> the source that reads it
        self.locals = self._local_ops()
        # loops (innermost last) whose invariant reads are being read once, before the loop
        self._hoists: list[_Hoist] = []
        self._hoist_names = itertools.count()
        self.plan.entry_src = self._block_entry
        self.plan.row_of_entry = self._row_of_entry
        # constant meter changes and statement counts not yet emitted (see ``_tally``)
        self._deltas: list[tuple[int, bool]] = []  # (bytes, whether a peak may be there)
        self._deltas_depth = 0
        self._counts: list[int] = []  # per loop body being emitted: its statements so far
        # the fusion pass's statements, on a backend that compiles them (jax): runs of pure
        # statements, whole loops and whole iterations as one compiled call each
        self.regions = RegionEmitter(self) if backend.fuses else None
        self.loops = LoopEmitter(self) if self.regions is not None else None
        self.bodies = BodyEmitter(self.loops) if self.loops is not None else None
        # host calls whose results only host calls read (a metrics sink, an episode tally):
        # they stay numpy arrays
        host_readers: dict[int, bool] = {}
        for reader in self.ops.values():
            is_host = prims.get(reader.prim).traits.host
            for e in reader.inputs:
                host_readers[e.src.id] = host_readers.get(e.src.id, True) and is_host
        self.host_only = {
            i
            for i, op in self.ops.items()
            if prims.get(op.prim).traits.host and i not in self.keep and host_readers.get(i, True)
        }

    # --- which values can live in locals -------------------------------------------------------
    def _local_ops(self) -> set[int]:
        """Ops read only at their own point, inside the loop iteration that computes them."""
        readers: dict[int, list[Edge]] = {i: [] for i in self.ops}
        for op in self.ops.values():
            for e in op.inputs:
                readers[e.src.id].append(e)
        frees: dict[int, list[Free]] = {}
        body_of: dict[int, int] = {}  # id of a statement -> id of the loop body holding it

        def visit(body: list[Stmt]) -> None:
            for s in body:
                body_of[id(s)] = id(body)
                if isinstance(s, Free):
                    frees.setdefault(s.op.id, []).append(s)
                elif isinstance(s, Loop):
                    visit(s.body)

        visit(self.schedule.body)
        computed_in = {
            s.op.id: body_of[id(s)] for s in self.schedule.statements() if isinstance(s, Compute)
        }
        out = set()
        for op in self.ops.values():
            if op.id in self.keep or not readers[op.id]:
                continue
            if op.id in self.plan.blocks or op.id in self.plan.swapped_points:
                continue  # (a swapped point's store moves it to disk and back)
            same = all(
                all(i is d for i, d in zip(e.index, op.domain, strict=True)) for e in readers[op.id]
            )
            fs = frees.get(op.id, [])
            # freed once, in the body that computes it (a free moved into an inner loop runs
            # at every iteration of it, and would count the bytes out each time)
            point_free = (
                len(fs) == 1
                and fs[0].prefix == tuple(op.domain)
                and not fs[0].pinned
                and body_of[id(fs[0])] == computed_in.get(op.id)
            )
            if same and point_free:
                out.add(op.id)
        return out

    # --- emitting ------------------------------------------------------------------------------
    def const(self, prefix: str, value: Any) -> str:
        name = f"{prefix}{len(self.ns)}"
        self.ns[name] = value
        return name

    def emit(self, depth: int, line: str) -> None:
        if self._deltas and (
            depth != self._deltas_depth or line.endswith(":") or _READS_METER.search(line)
        ):
            self._flush_deltas()
        self.lines.append("    " * depth + line)

    def _tally(self, depth: int, nbytes: int, peak: bool = True) -> None:
        """A constant change of the live-bytes meter, emitted with its neighbours as one.

        Each kernel's ``M[0] += n`` and peak test, and its inputs' ``M[0] -= n``, were a
        third of the rollout loop's own lines. A run of constant changes at one depth, with
        only kernels between them (which do not read the meter), is one change by their sum
        and one peak test at their largest running sum: the same count and peak. A change
        without ``peak`` (a merge that allocates nothing, ``donation.aliasing_merges``) is not
        a candidate for that sum.
        """
        if self._deltas and depth != self._deltas_depth:
            self._flush_deltas()
        self._deltas_depth = depth
        if nbytes:
            self._deltas.append((nbytes, peak))

    def _flush_deltas(self) -> None:
        deltas, self._deltas = self._deltas, []
        running = top = 0
        for n, peak in deltas:
            running += n
            if peak:
                top = max(top, running)
        pad = "    " * self._deltas_depth
        if top > 0:
            self.lines.append(f"{pad}if M[0] + {top} > M[1]: M[1] = M[0] + {top}")
        if running:
            self.lines.append(f"{pad}M[0] {'+' if running > 0 else '-'}= {abs(running)}")

    def _count(self, depth: int) -> None:
        """One statement run: counted once per loop body (the counter is a statistic)."""
        if self._counts and depth == self._conds[-1][0]:
            self._counts[-1] += 1
        else:
            self.emit(depth, "C[0] += 1")

    def key_src(self, items: list[str]) -> str:
        return "(" + "".join(f"{x}, " for x in items) + ")"

    def read_src(self, edge: Edge) -> str:
        """The source of the value ``edge`` reads, through ``read_through`` when set (a
        region run as numpy kernels converts what it reads from outside)."""
        src = self._read_src(edge)
        return src if self.read_through is None else self.read_through(edge, src)

    def _read_src(self, edge: Edge) -> str:
        """One source per distinct read: a slice read twice (a rollout's rows read by two
        ops of one region) is one gather, which a region passes once. Without regions a
        source may be a local read before the loop being emitted, valid in that loop only."""
        if self.regions is None:
            return self._new_read_src(edge)
        key = (
            edge.src.id,
            tuple(
                (self.names.src(i.start), self.names.src(i.stop))
                if isinstance(i, Slice)
                else self.names.src(i)
                for i in edge.index
            ),
        )
        found = self._reads.get(key)
        if found is None:
            found = self._reads[key] = self._new_read_src(edge)
        return found

    def _new_read_src(self, edge: Edge) -> str:
        src = edge.src
        if src.id in self.locals:
            return f"v{src.id}"
        if src.id in self.plan.blocks:
            direct = self.plan.block_read_src(edge, self.names.src)
            if direct is not None:
                return direct
        if not any(isinstance(i, Slice) for i in edge.index):
            return self._point_read(edge)
        axes = []
        for idx in edge.index:
            if isinstance(idx, Slice):
                axes.append(f"range({self.names.src(idx.start)}, {self.names.src(idx.stop)})")
            else:
                axes.append(f"({self.names.src(idx)},)")
        kinds = self.const("KINDS", [isinstance(i, Slice) for i in edge.index])
        elem = (
            tuple(s.value for s in src.shape)
            if all(isinstance(s, Const) for s in src.shape)
            else None
        )
        backend, dtype = self.backend, src.dtype

        def empty(shape_after: tuple, elem=elem) -> Any:
            return backend.zeros(shape_after + elem, dtype)

        gather = self.const(
            "GATHER",
            functools.partial(gather_points, stack=backend.stack, missing=_missing(src.label)),
        )
        if elem is not None:
            return f"{gather}(S{src.id}, ({', '.join(axes)},), {kinds}, empty={self.const('EMPTY', empty)})"
        # the element shape changes with the point: an empty slice is made at this point
        shape = ", ".join(self.names.src(x) for x in element_shape(edge))
        make = self.const(
            "EMPTYAT", lambda shape: lambda after: backend.zeros(after + shape, dtype)
        )
        return f"{gather}(S{src.id}, ({', '.join(axes)},), {kinds}, empty={make}(({shape},)))"

    # --- reads a loop does not change, read once before it ---------------------------------------
    def _invariant(self, op_id: int, dims: frozenset, block: bool) -> _Hoist | None:
        """The innermost loop being emitted, if a read of ``op_id`` at a key over ``dims``
        gives the same value at each of its iterations: the key does not move with the loop,
        and nothing in the loop writes, frees or swaps that store's entries (a block's entry
        is only replaced by an allocation, a free or a swap: writing its rows keeps it)."""
        if not self._hoists:
            return None
        frame = self._hoists[-1]
        if frame.loop.dim in dims or op_id in (frame.blocks if block else frame.points):
            return None
        return frame

    def _hoisted(self, frame: _Hoist, store: str, key: str) -> str:
        found = frame.reads.get((store, key))
        if found is None:
            # ``get``: the loop may not run, or read it only under a guard that never holds
            found = frame.reads[(store, key)] = f"_h{next(self._hoist_names)}"
            frame.lines.append(f"{found} = {store}.get({key})")
        return found

    def _row_of_entry(self, entry: str, row: str) -> str:
        """``entry[0][row]``: one row of a block's entry. On a backend with ``row_views``,
        where the entry was read before a loop over its rows, the row's view, from views of
        all rows made once before the loop with it."""
        frame = next((f for f in self._hoists if entry in f.reads.values()), None)
        views = self.backend.row_views
        if frame is None or views is None:
            return f"{entry}[0][{row}]"
        if not re.search(rf"\b{re.escape(self.names.of(frame.loop.dim))}\b", row):
            return f"{entry}[0][{row}]"  # not a loop over these rows: one view is enough
        local = frame.reads.get(("ROWS", entry))
        if local is None:
            local = frame.reads[("ROWS", entry)] = f"_h{next(self._hoist_names)}"
            if "ROWVIEWS" not in self.ns:
                self.ns["ROWVIEWS"] = lambda e: None if e is None else views(e[0])
            frame.lines.append(f"{local} = ROWVIEWS({entry})")
        return f"{local}[{row}]"

    def _point_read(self, edge: Edge) -> str:
        """``S{id}[key]`` (one point of a point store), or the local it was read into before
        the loop."""
        key = self.key_src([self.names.src(i) for i in edge.index])
        dims = frozenset(x for i in edge.index for x in i.symbols() if isinstance(x, Dim))
        frame = self._invariant(edge.src.id, dims, block=False)
        if frame is None:
            return f"S{edge.src.id}[{key}]"
        return self._hoisted(frame, f"S{edge.src.id}", key)

    def _block_entry(self, op_id: int, key: str, dims: frozenset) -> str:
        """``BL{id}[key]`` (a block's rows and marks at an outer point), or its local."""
        frame = self._invariant(op_id, dims, block=True)
        if frame is None or op_id in self.plan.rings or self.plan.storage[op_id].streamed:
            return f"BL{op_id}[{key}]"
        return self._hoisted(frame, f"BL{op_id}", key)

    def _enter(self, loop: Loop) -> _Hoist:
        """What ``loop``'s body changes: the stores it writes, frees or swaps, and the blocks
        its inner loops allocate (a block's own loop allocates it before it starts)."""
        if self._deltas:  # they belong before the reads made before the loop
            self._flush_deltas()
        frame = _Hoist(loop, at=len(self.lines))

        def visit(body: list[Stmt]) -> None:
            for st in body:
                if isinstance(st, Loop):
                    frame.blocks.update(op.id for op in self.plan.allocated_by(st))
                    visit(st.body)
                elif isinstance(st, (Free, SwapOut, SwapIn)):
                    frame.points.add(st.op.id)
                    frame.blocks.add(st.op.id)
                elif isinstance(st, Compute):
                    frame.points.add(st.op.id)
                    k = self.donations.get(st.op.id)
                    if k is not None:  # the donor's point is taken out of its store
                        frame.points.add(st.op.inputs[k].src.id)

        visit(loop.body)
        self._hoists.append(frame)
        return frame

    def _leave(self, frame: _Hoist, depth: int) -> None:
        self._hoists.pop()
        if not frame.reads:
            return
        self.lines[frame.at : frame.at] = ["    " * depth + line for line in frame.lines]
        # a local left set would keep a freed block alive, unseen by the meter
        self.emit(depth, " = ".join([*frame.reads.values(), "None"]))

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

    def cond(self, c: Condition, depth: int) -> str:
        """Source testing ``c`` at ``depth``: a local evaluated once per iteration of the
        loop body where it is first needed, when that is at the body's own depth.

        A PPO update body guards a few hundred statements (the last minibatch's values, the
        carried state) with the same two or three conditions; evaluated inline, that one
        expression was a third of the generated source's tokens (Python's compile of the
        function peaks at about 7 KB a line) and was re-evaluated at every statement. Only
        conditions over loop indices and static bounds are kept: those cannot change inside
        one iteration, while a dynamic bound is assigned when its loop ends.
        """
        src = self.names.src(c)
        syms = c.symbols()
        if (
            not self._conds
            or not syms
            or any(isinstance(x, Bound) and x not in self._static for x in syms)
        ):
            return src
        for _, seen in reversed(self._conds):
            if src in seen:
                return seen[src]
        top, seen = self._conds[-1]
        if depth != top:  # inside a branch: a local set there may be unset on a later path
            return src
        name = f"_g{next(self._cond_names)}"
        self.emit(depth, f"{name} = {src}")
        seen[src] = name
        return name

    def compute(self, op: Op, depth: int) -> None:
        var = f"v{op.id}"
        point = self.key_src([self.names.of(d) for d in op.domain])
        body_depth = depth
        if op.guard != TRUE:
            self.emit(depth, f"if {self.cond(op.guard, depth)}:")
            body_depth += 1
        if op.id in self.trim_before:
            self.emit(body_depth, "TRIM()")
        in_place = self.plan.writes_row(op, self.backend)
        if op.id in self.plan.aliases:
            pass  # its rows are its base block's: nothing to compute
        elif in_place:
            # the kernel writes the row; no local keeps it (a view would keep the block alive)
            row, mark = self.plan.row_src(op, self.names.of)
            self.call(op, body_depth, var, point, row=row)
            self.emit(body_depth, mark)
        elif prims.get(op.prim).traits.piecewise:
            self.merge(op, body_depth, var, broadcast=not self._row_broadcasts(op))
        else:
            self.call(op, body_depth, var, point)
        if in_place:
            pass  # the kernel wrote its row
        elif op.id in self.plan.blocks:
            for line in self.plan.block_write_src(op, var, self.names.of):
                self.emit(body_depth, line)
        elif op.id not in self.locals:
            self.emit(body_depth, f"S{op.id}[{point}] = {var}")
        self.alloc(op, body_depth, var)
        for line in self.plan.read_src(op):
            self.emit(body_depth, line)
        if not in_place and op.id not in self.plan.aliases:
            self.drop_stored(op, body_depth, var)
        self._count(body_depth)

    def drop_stored(self, op: Op, depth: int, var: str) -> None:
        """Drop the local of a value just put in its store or copied into its block's row:
        readers read the store or the block, and a local left behind would keep the value
        alive after its free, until the next point reassigns it (a parameter-sized array an
        iteration; the last observation a rollout wrote into its block, through the whole
        update; both unseen by the meter)."""
        if op.id not in self.locals:
            self.emit(depth, f"{var} = None")

    def start(self, op: Op, depth: int) -> None:
        """Start ``op``'s host call in the background; its compute later waits for it."""
        if op.guard != TRUE:
            self.emit(depth, f"if {self.names.src(op.guard)}:")
            depth += 1
        begin = self.const("K", host_call(op, self.backend, "begin"))
        self.emit(depth, f"{begin}({', '.join(self.read_src(e) for e in op.inputs)})")

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
        if donate is None and row is None and self._inline(op, depth, var):
            return
        call = prepare_call(op, self.backend, self.seed, donate, row=row is not None)
        if op.id in self.host_only or (
            prims.get(op.prim).traits.host and getattr(self.backend, "host_results_numpy", False)
        ):
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

    def _attr_src(self, value: Any) -> str:
        if isinstance(value, (Expr, Condition)):
            return self.names.src(value)
        return self.const("A", value)

    def free(self, stmt: Free, depth: int) -> None:
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
            for line in self.plan.block_free_src(stmt, key):
                self.emit(depth, line)
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

    def loop(self, loop: Loop, depth: int, outer: FusedStmt | None) -> None:
        """A loop run in Python; ``outer``: the loop iteration hooks run between the
        iterations of (``CTL``), None without hooks."""
        for line in self.plan.allocate_src(loop, self.names.of):
            self.emit(depth, line)
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
            frame = self._enter(loop) if self.regions is None else None
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

    def body(self, stmts: list[FusedStmt], depth: int, outer: FusedStmt | None) -> None:
        """``stmts`` emitted at ``depth``; ``outer``: the statement of the loop iteration
        hooks run between the iterations of (None: no hooks)."""
        if not stmts:
            self.emit(depth, "pass")
        self._conds.append((depth, {}))
        self._counts.append(0)
        for s in stmts:
            if isinstance(s, Compute):
                self.compute(s.op, depth)
            elif isinstance(s, Free):
                self.free(s, depth)
            elif isinstance(s, Start):
                self.start(s.op, depth)
            elif isinstance(s, (SwapOut, SwapIn)):
                key = self.key_src([self.names.src(p) for p in s.prefix])
                for line in self.plan.swap_src(s, key):
                    self.emit(depth, line)
            elif isinstance(s, Loop):
                self.loop(s, depth, outer)
            elif isinstance(s, Region):
                self.regions.emit(s, depth)
            elif isinstance(s, FusedLoop):
                self.loops.emit(s, depth)
            else:
                self._fused_iterations(s, depth, outer)
        if self._counts[-1]:
            self.emit(depth, f"C[0] += {self._counts[-1]}")
        if self._deltas:
            self._flush_deltas()
        self._counts.pop()
        self._conds.pop()

    def generate(
        self, static_bounds: dict[Bound, int], outer: FusedStmt | None, apart: bool = False
    ) -> Callable:
        """The run function; ``outer``: the statement of the loop iteration hooks run
        between the iterations of (None: no hooks). ``apart``: Python compiles it on a thread
        of its own, so that what its compiler frees stays out of the heap the run allocates
        from (``heap.compile_apart``)."""
        self.ns.update(
            NB=self.backend.nbytes,
            TRUTH=self.backend.truth,
            FREE_ALL=functools.partial(_free_all, nbytes=self.backend.nbytes),
            FREE_PREFIX=functools.partial(_free_prefix, nbytes=self.backend.nbytes),
            FREE_ALL_VIEW=functools.partial(_free_all, nbytes=_no_bytes),
            FREE_PREFIX_VIEW=functools.partial(_free_prefix, nbytes=_no_bytes),
            FREE_ALL_N=_free_all_n,
            FREE_PREFIX_N=_free_prefix_n,
            ROWSTORE=RowStore.adopt,
        )
        self.bounds = {b: Const(int(v)) for b, v in static_bounds.items()}
        self._static = set(static_bounds)
        head = []
        for b, v in static_bounds.items():
            head.append(f"    {self.names.of(b)} = {int(v)}")
        self.body(self.stmts, 1, outer)
        rows = self.loops.row_stores if self.loops is not None else set()
        stores = "".join(
            f"    S{i} = ROWSTORE(STORES, {i})\n" if i in rows else f"    S{i} = STORES[{i}]\n"
            for i in self.ops
            if i not in self.locals
        )
        stores += "".join(f"    BL{i} = S{i}.blocks\n" for i in self.plan.blocks)
        src = (
            "def run(STORES, M, C, CTL):\n"
            + stores
            + "\n".join(head)
            + "\n"
            + "\n".join(self.lines)
            + "\n"
        )
        # bounds used before assignment (dynamic ones read outside their loop) fail clearly
        taken_again = {b for ragged in self._ragged.values() for b, _ in ragged}
        for s, name in self.names.sym.items():
            if (
                isinstance(s, Bound)
                and s not in static_bounds
                and (f"{name} = " not in src or s in taken_again)
            ):
                src = src.replace(
                    "def run(STORES, M, C, CTL):\n",
                    f"def run(STORES, M, C, CTL):\n    {name} = None\n",
                    1,
                )
        self.source = src
        # a name of its own in linecache, so that a traceback through the generated code
        # shows the line (and the tensor its comment names) where it failed
        name = f"{GENERATED_FILE} {next(_SOURCES)}>"
        code = compile_apart(src, name) if apart else compile(src, name, "exec")
        exec(code, self.ns)  # noqa: S102 - our own generated source
        run = self.ns["run"]
        linecache.cache[name] = (len(src), None, src.splitlines(keepends=True), name)
        weakref.finalize(run, linecache.cache.pop, name, None)
        return run


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
