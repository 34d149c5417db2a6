"""Compile a whole schedule into one generated Python function.

An interpreter pays, per statement, for dict lookups of symbol values, calls of compiled
index lambdas, closures and generic bookkeeping — more than the numpy kernels themselves cost
on RL-sized arrays. Here every loop becomes a Python ``for``/``while`` over local ints, every
index expression is inlined source, every kernel is a namespace constant with its static
attributes bound. What each statement kind emits is defined once, in ``statements.py``; this
module holds the generator around those emitters (names, reads, the meter, the walk over the
statements) and the optimisations it makes over them: a value only read at the same point
inside the same loop iteration lives in a local variable instead of a store, a read a loop
does not change is made once before it, constant meter changes are summed, a guard is
evaluated once per loop body, a view is an inline subscript, and the fusion pass's statements
are compiled calls. Memory accounting is kept exact: sizes known at compile time are inlined
as constants.

``reference=True`` makes none of these optimisations: the schedule's own statements, each
emitted on its own. That is the reference the generated code is tested against
(``compiled=False``).
"""

from __future__ import annotations

import functools
import itertools
import linecache
import re
import weakref
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from timerl.errors import BoundError, UndefinedPointError
from timerl.ir import prims
from timerl.ir.graph import Edge, Op
from timerl.memory.donation import aliasing_merges, owned_merges
from timerl.runtime.body_regions import BodyEmitter
from timerl.runtime.calls import element_shape, gather_points
from timerl.runtime.heap import compile_apart, trim_before_peak
from timerl.runtime.loop_regions import LoopEmitter
from timerl.runtime.regions import RegionEmitter
from timerl.runtime.row_store import RowStore
from timerl.runtime.statements import Statements, runtime_names
from timerl.runtime.store_plan import StorePlan
from timerl.schedule.fused import FusedLoop, FusedStmt, Region
from timerl.schedule.program import Compute, Free, Loop, Schedule, Start, Stmt, SwapIn, SwapOut
from timerl.symbolic import Bound, Condition, Const, Dim, Expr, Slice, Symbol

_SOURCES = itertools.count()  # numbers the generated sources registered in linecache
# how the file name of a generated source starts (tracebacks show it; tools find it by it)
GENERATED_FILE = "<timerl schedule"


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


class CodeGen(Statements):
    """Generates ``run(stores, meter, ctl)`` for one schedule on one backend.

    ``body``: the statements run, the fusion pass's included (``schedule/fused.py``; by
    default the schedule's own), each emitted as it says. ``reference``: the schedule's own
    statements each emitted on its own, without the generator's optimisations (the
    reference run, ``compiled=False``)."""

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
        reference: bool = False,
    ) -> None:
        self.schedule = schedule
        self.reference = reference
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
        self.locals = set() if reference else self._local_ops()
        # loops (innermost last) whose invariant reads are being read once, before the loop
        self._hoists: list[_Hoist] = []
        self._hoist_names = itertools.count()
        # constant meter changes and statement counts not yet emitted (see ``_tally``)
        self._deltas: list[tuple[int, bool]] = []  # (bytes, whether a peak may be there)
        self._deltas_depth = 0
        self._counts: list[int] = []  # per loop body being emitted: its statements so far
        # the fusion pass's statements, on a backend that compiles them (jax): runs of pure
        # statements, whole loops and whole iterations as one compiled call each
        self.regions = RegionEmitter(self) if backend.fuses and not reference else None
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
        if reference:
            self.host_only = set()

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
        if self.reference:  # each statement's own change
            self._flush_deltas()

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
        if self._counts and depth == self._conds[-1][0] and not self.reference:
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
            direct = self._block_read_src(edge)
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

    def _block_read_src(self, edge: Edge) -> str | None:
        """A row or a view of rows of one block; None for reads that span blocks."""
        src_of = self.names.src
        outer, last = edge.index[:-1], edge.index[-1]
        if any(isinstance(i, Slice) for i in outer):
            return None
        key = self.key_src([src_of(i) for i in outer])
        if edge.src.id in self.plan.rings:
            if isinstance(last, Slice):
                return f"S{edge.src.id}.window({key}, {src_of(last.start)}, {src_of(last.stop)})"
            return f"S{edge.src.id}[{key[:-1]} {src_of(last)},)]"
        dims = frozenset(x for i in outer for x in i.symbols() if isinstance(x, Dim))
        entry = self._block_entry(edge.src.id, key, dims)
        rows = f"{entry}[0]"
        if isinstance(last, Slice):
            return f"{rows}[{src_of(last.start)}:{src_of(last.stop)}]"
        if edge.src.shape:  # ``[k]`` (torch takes a third less time than ``[k, ...]``)
            return self._row_of_entry(entry, src_of(last))
        # ``[k, ...]`` keeps a 0-d row an array (``[k]`` would give a numpy scalar)
        return f"{rows}[{src_of(last)}, ...]"

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
            self.reference
            or not self._conds
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

    def _attr_src(self, value: Any) -> str:
        if isinstance(value, (Expr, Condition)):
            return self.names.src(value)
        return self.const("A", value)

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
                self.swap(s, depth)
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
        self.ns.update(runtime_names(self.backend), ROWSTORE=RowStore.adopt)
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
