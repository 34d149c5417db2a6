"""The executor: runs a schedule statement by statement over point-indexed stores.

Each compute statement is prepared once into a closure (index expressions compiled to Python
lambdas, the backend kernel looked up) so the per-point cost is a few dict lookups and one
kernel call. Stores map a point (tuple of ints) to a value; ``Free`` statements drop points,
and the memory meter counts live bytes at every statement.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from timerl.compiler.donation import aliasing_merges, copies_branch, owned_merges
from timerl.errors import BoundError, TimerlError, UndefinedPointError
from timerl.ir import prims
from timerl.ir.graph import Edge, Op
from timerl.ir.validate import exclusive_conditions
from timerl.runtime import heap
from timerl.runtime.backend import Backend
from timerl.runtime.calls import element_shape, gather_points, host_call, prepare_call
from timerl.runtime.codegen import CodeGen
from timerl.runtime.heap import TRIM_PEAK, HeapTrim, release_free_heap
from timerl.runtime.stores import (
    BlockStore,
    StorePlan,
    StreamStore,
    SwappablePoints,
    TierMeter,
)
from timerl.schedule.fused import FusedSchedule, FusedStmt
from timerl.schedule.program import Compute, Free, Loop, Schedule, Start, Stmt, SwapIn, SwapOut
from timerl.symbolic import (
    TRUE,
    Bound,
    Condition,
    Const,
    Dim,
    Expr,
    Slice,
    Symbol,
    compile_exprs,
)


@dataclass
class MemoryMeter:
    live: int = 0
    peak: int = 0
    allocations: int = 0

    def add(self, n: int, allocated: bool = True) -> None:
        """``allocated=False``: bytes that are no new array (a merge returns its branch's,
        freed next, ``donation.aliasing_merges``): live, but neither an allocation nor a
        peak."""
        self.live += n
        if not allocated:
            return
        self.allocations += 1
        if self.live > self.peak:
            self.peak = self.live

    def sub(self, n: int) -> None:
        self.live -= n


@dataclass
class RunStats:
    seconds: float = 0.0
    statements: int = 0
    memory: MemoryMeter = field(default_factory=MemoryMeter)
    tier: TierMeter = field(default_factory=TierMeter)  # the next tier: swapped, streamed


UNBOUNDED = 2**62


class _Control:
    """What generated code asks of its executor: where to start, hooks, dynamic bounds."""

    def __init__(self, ex: Executor) -> None:
        self.start = ex._start
        self._after = ex._on_iteration
        self._before = ex._before_outer
        self.caps = ex.dynamic
        self.lengths = ex.dynamic_values
        self.meter: list[int] | None = None  # the run's [live, peak] bytes, once it has one
        self.trim = ex._trim

    def before(self) -> None:
        if self._before is not None:
            self._before()

    def after(self, p: int) -> None:
        if self.meter is not None:
            self.trim.after_iteration(self.meter[1])
        if self._after is not None:
            self._after(p)


class _Env(dict):
    """Symbol values; a missing dynamic bound gets a message instead of a bare KeyError."""

    def __missing__(self, key: Symbol) -> int:
        if isinstance(key, Bound):
            raise BoundError(
                f"bound {key.name} is not known here: it is set by ctx.until when its loop ends, "
                "and an op inside that loop reads it"
            )
        raise BoundError(f"no value for {key.name} at this point of the schedule")


def _compile(items: list[Expr | Condition]) -> Callable[[Mapping], tuple]:
    syms = sorted(
        set().union(*(i.symbols() for i in items)) if items else set(), key=lambda s: s.uid
    )
    fn = compile_exprs(items, syms)
    if not syms:
        values = fn()
        return lambda env: values
    return lambda env: fn(*[env[s] for s in syms])


class Executor:
    def __init__(
        self,
        schedule: Schedule,
        ops: list[Op],
        backend: Backend,
        bounds: Mapping[Bound, int],
        dynamic: Mapping[Bound, int | None],
        seed: int = 0,
        keep: set[int] | None = None,
        compiled: bool = True,
        storage: Mapping[int, Any] | None = None,
        donations: Mapping[int, int] | None = None,
        keep_freed_pages: bool = True,
        reuse_up_to: int = 0,
        heap_reserve: int = 0,
        huge_page_advice: bool = True,
        spare_blocks: Iterable[int] = (),
        trim_before: Iterable[int] = (),
        fused: FusedSchedule | None = None,
    ) -> None:
        self.schedule = schedule
        # the statements as the backend runs them (``compiler/fusion.py``): the generated
        # code's; None: the schedule's own
        self.fused = fused
        self._ragged = schedule.ragged_lengths()
        # False: numpy's huge-page advice is off while this runs (``heap.numpy_huge_pages``)
        self.huge_page_advice = huge_page_advice
        # runtime/heap.py; not under a memory budget, nor where arrays mapped apart hold most
        # of the peak (``Program._keeps_freed_pages``)
        self.keep_freed_pages = keep_freed_pages
        # ... while arrays up to this many bytes still reuse the heap's pages
        self.reuse_up_to = reuse_up_to
        # bytes of heap pages to fault in at setup (``heap.reserve``): the planned peak of the
        # arrays the heap serves, where pages are kept; the bytes reserved once done
        self.heap_reserve = heap_reserve if keep_freed_pages and backend.heap_arrays else 0
        # ops before which a heap that keeps no freed pages gives its free ones back: where
        # the plan peaks (``heap.trim_before_peak``)
        self.trim_before = (
            frozenset(trim_before) if not keep_freed_pages and backend.heap_arrays else frozenset()
        )
        self._reserved = 0
        # op id -> the input whose buffer it writes into, where this backend can
        self.donations = backend.donations(donations or {}, ops)
        # block stores write points in place: a backend of immutable arrays (jax) keeps a
        # point store per op (the schedule's frees are valid for both)
        self.storage = dict(storage or {}) if backend.name != "jax" else {}
        self.plan = StorePlan(schedule, self.storage)
        self.keep = set(keep or ())
        self.compiled = compiled
        self._generated: dict[bool, Callable] = {}
        self.source = ""
        self.backend = backend
        backend.check(ops)  # a missing lowering fails here, naming the op, not mid-run
        self.bounds = dict(bounds)
        self.dynamic = dict(dynamic)  # bound -> cap (None: no cap)
        self.seed = seed
        # a dict per op, or a BlockStore where the storage plan says so (both executors)
        self.stats = RunStats()
        self.stores: dict[int, Any] = self.plan.make_stores(ops, backend, self.stats.tier)
        # blocks whose freed rows are kept for their next allocation (on the CPU, where rows
        # are a numpy array's memory: ``BlockStore.keep_spare``); made and faulted in by
        # ``prepare``
        kept = spare_blocks if backend.heap_arrays else ()
        self._spares = [s for i in kept if type(s := self.stores.get(i)) is BlockStore]
        self.ops = {op.id: op for op in ops}
        # merges a donation writes into: a constant they take is copied (``owned_merges``)
        self._owned = owned_merges(self.donations, self.ops)
        self._quiet = aliasing_merges(ops, self._owned)  # merges that allocate nothing
        self._trim = HeapTrim()
        self.dynamic_values: dict[Bound, dict[tuple, int]] = {b: {} for b in self.dynamic}
        self._prepared: dict[int, Callable[[dict], None]] = {}
        self._outer: Loop | None = None
        self._start = 0
        self._on_iteration: Callable[[int], None] | None = None
        self._before_outer: Callable[[], None] | None = None
        self._free_fns: dict[int, Callable] = {}
        self._start_fns: dict[int, Callable] = {}

    # --- preparing statements -----------------------------------------------------------------
    def _reader(self, edge: Edge, take: bool = False) -> Callable[[dict], Any]:
        """Read ``edge`` at a point; ``take`` also removes the point from its store (a
        donated input: its buffer becomes the reader's result)."""
        src = edge.src
        store = self.stores[src.id]
        parts: list[Expr | Condition] = []
        slices = []
        for idx in edge.index:
            if isinstance(idx, Slice):
                slices.append(len(parts))
                parts.extend([idx.start, idx.stop])
            else:
                parts.append(idx)
        fn = _compile(parts)
        label = src.label
        if src.id in self.plan.blocks and not any(isinstance(i, Slice) for i in edge.index[:-1]):
            return self._block_reader(edge, fn)

        def missing(key: tuple) -> Any:
            raise UndefinedPointError(
                f"{label} at {key} is not available: it was never computed or already freed "
                "(this is a scheduling bug; please report it with the program)"
            )

        if take:

            def take_point(env: dict) -> Any:
                key = fn(env)
                try:
                    return store.pop(key)
                except KeyError:
                    return missing(key)

            return take_point

        if not slices:

            def read(env: dict) -> Any:
                key = fn(env)
                try:
                    return store[key]
                except KeyError:
                    return missing(key)

            return read

        stack = self.backend.stack
        kinds = [isinstance(i, Slice) for i in edge.index]
        elem = (
            tuple(s.value for s in src.shape)
            if all(isinstance(s, Const) for s in src.shape)
            else None
        )
        zeros, dtype = self.backend.zeros, src.dtype
        # an empty slice of a tensor whose shape depends on the point still has that shape
        elem_fn = None if elem is not None else _compile(list(element_shape(edge)))

        def empty(shape_after: tuple) -> Any:
            return zeros(shape_after + elem, dtype)

        def read_slices(env: dict) -> Any:
            vals = fn(env)
            make_empty = empty
            if elem_fn is not None:
                shape = tuple(elem_fn(env))
                make_empty = lambda after: zeros(after + shape, dtype)  # noqa: E731
            axes: list[range | tuple[int]] = []
            k = 0
            for is_slice in kinds:
                if is_slice:
                    axes.append(range(vals[k], vals[k + 1]))
                    k += 2
                else:
                    axes.append((vals[k],))
                    k += 1
            return gather_points(store, axes, kinds, stack, missing, make_empty)

        return read_slices

    def _block_reader(self, edge: Edge, fn: Callable[[Mapping], tuple]) -> Callable[[dict], Any]:
        """A row of a block, or a view of rows: no stacked copy."""
        store = self.stores[edge.src.id]
        blocks = store.blocks
        outer = len(edge.index) - 1
        if edge.src.id in self.plan.rings:  # rows mod the ring's size, checked as they are read
            if isinstance(edge.index[-1], Slice):
                return lambda env: store.window(*_split(fn(env), outer))
            return lambda env: store[tuple(fn(env))]
        if isinstance(edge.index[-1], Slice):

            def read_rows(env: dict) -> Any:
                vals = fn(env)
                return blocks[vals[:outer]][0][vals[outer] : vals[outer + 1]]

            return read_rows

        def read_row(env: dict) -> Any:
            vals = fn(env)
            return blocks[vals[:outer]][0][vals[outer], ...]

        return read_row

    def _prepare(self, op: Op) -> Callable[[dict], None]:
        return _guarded(op, self._prepare_unguarded(op))

    def _prepare_start(self, op: Op) -> Callable[[dict], None]:
        """Start ``op``'s host call in the background; its Compute later waits for it."""
        begin = host_call(op, self.backend, "begin")
        readers = [self._reader(e) for e in op.inputs]

        def start(env: dict) -> None:
            begin(*[read(env) for read in readers])

        return _guarded(op, start)

    def _prepare_unguarded(self, op: Op) -> Callable[[dict], None]:
        backend = self.backend
        store = self.stores[op.id]
        meter = self.stats.memory
        dims = op.domain
        point_of = (lambda env: tuple(env[d] for d in dims)) if dims else (lambda env: ())
        # a block's rows were counted when it was allocated; a view of one allocates nothing
        shared = op.id in self.plan.blocks or op.id in self.plan.views
        if op.id in self.plan.aliases:  # its rows are its base block's: only mark the point
            written = store.blocks

            def mark(env: dict) -> None:
                point = point_of(env)
                written[point[:-1]][1][point[-1]] = True

            return mark
        donate = self.donations.get(op.id)
        row = self.plan.writes_row(op, backend)  # its kernel writes its row of the block
        readers = [self._reader(e, take=k == donate) for k, e in enumerate(op.inputs)]
        shared = shared or donate is not None  # a donated result is its input's bytes
        if prims.get(op.prim).traits.piecewise:
            conds = _compile(exclusive_conditions(op))
            shape_fn = _compile(list(op.shape))
            dtype = op.dtype
            where = op.where()
            quiet = op.id in self._quiet
            copied = [copies_branch(op, e, self._owned) for e in op.inputs]

            def run_merge(env: dict) -> None:
                taken = conds(env)
                for k, hit in enumerate(taken):
                    if hit:
                        value = backend.broadcast(readers[k](env), shape_fn(env), dtype)
                        if copied[k]:  # a donation will write into it
                            value = backend.copy(value)
                        break
                else:
                    raise UndefinedPointError(f"{where} has no definition at {point_of(env)}")
                point = point_of(env)
                store[point] = value
                meter.add(0 if shared else backend.nbytes(value), allocated=not quiet)

            return run_merge
        call = prepare_call(op, backend, self.seed, donate, row=row)
        kernel = call.fn
        out = call.out
        layout: list[tuple[str, int, bool]] = []  # name, count, is_tuple
        point_items: list[Expr | Condition] = []
        for name, value in call.point_attrs:
            if isinstance(value, (tuple, list)):
                layout.append((name, len(value), True))
                point_items.extend(_as_expr(v) for v in value)
            else:
                layout.append((name, 1, False))
                point_items.append(_as_expr(value))
        point_fn = _compile(point_items) if layout else None
        key_fn = _compile([_as_expr(c) for c in call.key[1]]) if call.key is not None else None
        key_prefix = call.key[0] if call.key is not None else ()
        udf_point = call.pass_point
        no_attrs: dict[str, Any] = {}
        reads = self.plan.read_bytes.get(op.id, 0)

        def run(env: dict) -> None:
            args = [r(env) for r in readers]
            attrs = no_attrs
            point = point_of(env)
            if point_fn is not None:
                vals = point_fn(env)
                attrs = {}
                k = 0
                for name, count, is_tuple in layout:
                    attrs[name] = tuple(vals[k : k + count]) if is_tuple else vals[k]
                    k += count
            if key_fn is not None:
                attrs = dict(attrs)
                attrs["key"] = key_prefix + tuple(key_fn(env))
            if out is not None:
                attrs = dict(attrs, out=args[out])
            if row:
                kernel(*args, **attrs, out=store.row_to_write(point))
            else:
                value = kernel(*args, point) if udf_point else kernel(*args, **attrs)
                store[point] = value
                meter.add(0 if shared else backend.nbytes(value))
            if reads and meter.live + reads > meter.peak:  # the chunks it read rows into
                meter.peak = meter.live + reads

        return run

    def _prepare_free(self, stmt: Free) -> Callable[[dict], None]:
        store = self.stores[stmt.op.id]
        meter = self.stats.memory
        nbytes = self.backend.nbytes
        if stmt.op.id in self.plan.blocks:
            return self._prepare_block_free(stmt)
        if stmt.op.id in self.plan.views:
            nbytes = lambda value: 0  # noqa: E731 - the block it views holds the bytes
        full = len(stmt.prefix) == len(stmt.op.domain)
        fn = _compile(list(stmt.prefix)) if stmt.prefix else None
        pins = _compile(list(stmt.pinned)) if stmt.pinned else None

        def free(env: dict) -> None:
            if fn is None:
                for value in store.values():
                    meter.sub(nbytes(value))
                store.clear()
                return
            key = fn(env)
            if pins is not None and key[-1] in pins(env):
                return
            if full:
                value = store.pop(key, None)
                if value is not None:
                    meter.sub(nbytes(value))
                return
            n = len(key)
            for point in [p for p in store if p[:n] == key]:
                meter.sub(nbytes(store.pop(point)))

        return free

    def _prepare_block_free(self, stmt: Free) -> Callable[[dict], None]:
        store = self.stores[stmt.op.id]
        meter = self.stats.memory
        if not stmt.prefix:
            return lambda env: meter.sub(store.free_all())
        fn = _compile(list(stmt.prefix))
        pins = _compile(list(stmt.pinned)) if stmt.pinned else None  # (an alias only)

        def free(env: dict) -> None:
            key = tuple(fn(env))
            if pins is None or key[-1] not in pins(env):
                meter.sub(store.free_prefix(key))

        return free

    def _allocate_blocks(self, loop: Loop, env: dict) -> None:
        for op in self.plan.allocated_by(loop):
            outer = tuple(env[d] for d in op.domain[:-1])
            if op.id in self.plan.aliases:
                self.stores[op.id].share(outer, self.stores[op.inputs[0].src.id])
                continue
            n = self.stores[op.id].allocate(outer)
            if n:
                self.stats.memory.add(n)

    # --- running ------------------------------------------------------------------------------
    def run(
        self,
        start: int = 0,
        on_iteration: Callable[[int], None] | None = None,
        before_outer: Callable[[], None] | None = None,
    ) -> RunStats:
        """Run the schedule; the single outermost loop may start at ``start`` (resuming from a
        snapshot), and ``on_iteration(p)`` is called after each of its iterations."""
        begin = time.perf_counter()
        hooked = bool(start or on_iteration or before_outer)
        self._outer = self.outer_loop() if hooked else None
        self._start, self._on_iteration, self._before_outer = start, on_iteration, before_outer
        self.backend.reset_device_peak()  # stats() reports this run's peak
        # iterations reuse each other's arrays
        heap.keep_freed_pages(self.keep_freed_pages, self.reuse_up_to)
        try:
            with heap.numpy_huge_pages_off(not self.huge_page_advice), self.backend.active():
                if self.compiled:
                    self.prepare(hooked)
                    self._trim.start(reserved=self._reserved > 0)
                    self._run_compiled(hooked)
                else:
                    env = _Env(self.bounds)
                    for b in self.dynamic:
                        env.pop(b, None)
                    self._run_body(self.schedule.body, env)
        finally:
            for store in self._spares:  # rows no block holds go back with the run
                if store.spare:
                    store.spare.clear()
            self.stats.seconds = time.perf_counter() - begin
            if self.stats.memory.peak >= TRIM_PEAK:
                release_free_heap()  # the pages the run's arrays were kept in
        return self.stats

    def prepare(self, hooked: bool = True) -> None:
        """Generate the code a run will execute now, so that the first iteration does not pay
        for it (``hooked``: the run will start mid-way or call iteration hooks)."""
        with self.backend.active():
            pass  # finds the math libraries to cap (backend.math_threads): the run reuses them
        # not where the user configured glibc's heap themselves (heap.keep_freed_pages)
        reserving = bool(self.heap_reserve) and heap.keep_freed_pages(True)
        if self.compiled and hooked not in self._generated:
            outer: FusedStmt | None = self.outer_loop() if hooked else None
            body = None
            if self.fused is not None:
                body = self.fused.hooked if hooked else self.fused.body
                outer = self.fused.outer if hooked else None
            gen = CodeGen(
                self.schedule,
                list(self.ops.values()),
                self.backend,
                self.seed,
                self.keep,
                self.storage,
                self.donations,
                self.trim_before,
                body,
            )
            # What compiling frees goes back to the system, unless the run's pages are
            # reserved: its first iteration fills those holes in the heap too (torch's
            # arrays, about 9 MiB on synthetic-e16), and would fault each page in again.
            # Where they are not, holes that the run's arrays fill stay resident after their
            # free, counted by no meter: the run function is compiled apart from that heap.
            self._generated[hooked] = gen.generate(self.bounds, outer, apart=not reserving)
            self.source = gen.source
            del gen
            if not reserving:
                release_free_heap()
        self.reserve_memory(reserving)

    def reserve_memory(self, reserving: bool) -> None:
        """Fault in, before the first iteration, the pages the run will use: the heap's
        (``heap.reserve``, where ``reserving``) and the spare rows of blocks mapped apart.
        Once a run; after this its pages count as the run's data, not the setup's."""
        if reserving and not self._reserved:
            self._reserved = heap.reserve(self.heap_reserve)
        if self._spares and not self._spares[0].spare:
            with heap.numpy_huge_pages_off(not self.huge_page_advice):
                for store in self._spares:
                    store.keep_spare(fault_in=True)

    def swapped_bytes(self) -> int:
        """Bytes moved to the next tier and back so far: swapped blocks and streamed ones."""
        return sum(
            s.moved + (s.streamed_bytes if isinstance(s, StreamStore) else 0)
            for s in self.stores.values()
            if isinstance(s, (BlockStore, SwappablePoints))
        )

    def read_stats(self) -> dict[str, Any] | None:
        """Chunked reads of streamed blocks so far: seconds kernels waited on the disk, chunks
        read ahead in time (hits) and chunks waited for (misses); None without a stream."""
        streams = [s for s in self.stores.values() if isinstance(s, StreamStore)]
        if not streams:
            return None
        waited, hits, misses = 0.0, 0, 0
        for s in streams:
            w, h, m = s.read_stats()
            waited, hits, misses = waited + w, hits + h, misses + m
        return {"read_wait_seconds": waited, "read_ahead_hits": hits, "read_ahead_misses": misses}

    def _run_compiled(self, hooked: bool) -> None:
        fn = self._generated[hooked]  # run() prepared it
        meter = self.stats.memory
        M = [meter.live, meter.peak]
        C = [0]
        ctl = _Control(self)
        ctl.meter = M
        try:
            fn(self.stores, M, C, ctl)
        finally:
            meter.live, meter.peak = M
            meter.allocations += C[0]
            self.stats.statements += C[0]

    def outer_loop(self) -> Loop:
        """The one top-level loop that holds the training state (resume and hooks need it)."""
        loops = [s for s in self.schedule.body if isinstance(s, Loop)]
        if loops:
            outer = min((s.dim for s in loops), key=lambda d: d.uid)
            loops = [s for s in loops if s.dim is outer]
        if len(loops) != 1 or not loops[0].forward:
            raise TimerlError(
                f"the program has {len(loops)} forward top-level loops over its outer dim; "
                "iteration hooks and resuming need exactly one"
            )
        return loops[0]

    def snapshot(self) -> dict[int, dict[tuple, np.ndarray]]:
        """The live state carried into the next iteration of the outer loop, as numpy.

        After an iteration's frees only what later iterations read is left in the stores of
        ops inside the loop: parameters, optimiser moments, the last observation.
        """
        dim = self.outer_loop().dim
        out: dict[int, dict[tuple, np.ndarray]] = {}
        for k, op in enumerate(self.ops.values()):
            store = self.stores[op.id]
            if dim not in op.domain:
                continue
            # a point a memory budget moved to disk between updates is state all the same
            items = store.all_items() if isinstance(store, SwappablePoints) else store.items()
            points = {p: self.backend.to_numpy(v).copy() for p, v in items}
            if points:
                out[k] = points
        return out

    def restore(self, snapshot: Mapping[int, Mapping[tuple, np.ndarray]]) -> None:
        ops = list(self.ops.values())
        for k, points in snapshot.items():
            store = self.stores[ops[k].id]
            for p, v in points.items():
                value = self.backend.asarray(v)
                if isinstance(store, BlockStore):  # the block's bytes, once
                    n = store.allocate(tuple(p)[:-1])
                    if n:
                        self.stats.memory.add(n)
                    store[tuple(p)] = value
                    continue
                store[tuple(p)] = value
                self.stats.memory.add(self.backend.nbytes(value))

    def _run_body(self, body: list[Stmt], env: dict) -> None:
        for stmt in body:
            if isinstance(stmt, Compute):
                fn = self._prepared.get(stmt.op.id)
                if fn is None:
                    fn = self._prepared[stmt.op.id] = self._prepare(stmt.op)
                if stmt.op.id in self.trim_before:
                    heap.trim_before_peak()
                fn(env)
                self.stats.statements += 1
            elif isinstance(stmt, Free):
                fn = self._free_fns.get(id(stmt))
                if fn is None:
                    fn = self._free_fns[id(stmt)] = self._prepare_free(stmt)
                fn(env)
            elif isinstance(stmt, Start):
                fn = self._start_fns.get(id(stmt))
                if fn is None:
                    fn = self._start_fns[id(stmt)] = self._prepare_start(stmt.op)
                fn(env)
            elif isinstance(stmt, (SwapOut, SwapIn)):
                store = self.stores[stmt.op.id]
                if not isinstance(store, (BlockStore, SwappablePoints)):
                    continue  # held as points on this backend: nothing to swap
                key = tuple(p.evaluate(env) for p in stmt.prefix)
                if isinstance(stmt, SwapOut):
                    self.stats.memory.sub(store.swap_out(key))
                else:
                    self.stats.memory.add(store.swap_in(key))
            else:
                self._run_loop(stmt, env)

    def _recorded_lengths(self, dim: Dim, env: dict) -> None:
        """The lengths ``until`` set at this point of ``dim`` (``Schedule.ragged_lengths``)."""
        for bound, dims in self._ragged.get(dim, ()):
            known = self.dynamic_values[bound].get(tuple(env.get(d) for d in dims))
            if known is not None:
                env[bound] = known

    def _run_loop(self, loop: Loop, env: dict) -> None:
        self._allocate_blocks(loop, env)
        dim, bound = loop.dim, loop.dim.bound
        if loop is self._outer:
            if self._before_outer is not None:
                self._before_outer()
            for p in range(self._start, env[bound]):
                env[dim] = p
                self._recorded_lengths(dim, env)
                self._run_body(loop.body, env)
                self._trim.after_iteration(self.stats.memory.peak)
                if self._on_iteration is not None:
                    self._on_iteration(p)
            env.pop(dim, None)
            return
        if loop.until is None:
            n = env[bound]
            points = range(n) if loop.forward else range(n - 1, -1, -1)
            for p in points:
                env[dim] = p
                self._recorded_lengths(dim, env)
                self._run_body(loop.body, env)
            env.pop(dim, None)
            return
        done_store = self.stores[loop.until.id]
        cap = self.dynamic.get(bound)
        outer = tuple(env[d] for d in loop.until.domain if d is not dim)
        # While the loop runs, its length is unknown: range guards see an unbounded dim.
        env[bound] = UNBOUNDED if cap is None else cap
        length = None
        for p in itertools.count():
            env[dim] = p
            self._run_body(loop.body, env)
            point = tuple(env[d] for d in loop.until.domain)
            if self.backend.truth(done_store[point]):
                length = p + 1
                break
            if cap is not None and p + 1 >= cap:
                length = cap
                break
        env.pop(dim, None)
        env[bound] = length
        self.dynamic_values[bound][outer] = length


def _as_expr(value: Any) -> Expr | Condition:
    if isinstance(value, (Expr, Condition)):
        return value
    if isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_)):
        return Const(int(value))
    return _Literal(value)


def _split(vals: tuple, outer: int) -> tuple:
    """``(outer point, start, stop)`` from a slice read's evaluated index."""
    return tuple(vals[:outer]), vals[outer], vals[outer + 1]


class _Literal(Expr):
    """A non-integer constant carried through the point-attribute machinery unchanged."""

    __slots__ = ("value",)

    def __init__(self, value: Any) -> None:
        self.value = value

    def symbols(self) -> frozenset:
        return frozenset()

    def source(self, names: Mapping) -> str:
        return (
            repr(float(self.value))
            if not isinstance(self.value, (bool, np.bool_))
            else repr(bool(self.value))
        )


__all__ = ["Executor", "MemoryMeter", "RunStats", "TimerlError"]


def _guarded(op: Op, run: Callable[[dict], None]) -> Callable[[dict], None]:
    """``run`` at the points where ``op``'s guard holds."""
    if op.guard == TRUE:
        return run
    guard = _compile([op.guard])

    def guarded(env: dict) -> None:
        if guard(env)[0]:
            run(env)

    return guarded
