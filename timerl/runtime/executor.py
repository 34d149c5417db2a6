"""The executor: runs a schedule over its stores, through the code it generates.

Stores map a point (tuple of ints) to a value (or hold a block of rows, ``stores.py``); the
statements that write, free and move them are the generated function's
(``codegen.py``, ``statements.py``), and the memory meter counts live bytes at every
statement. ``compiled=True`` runs the fusion pass's statements with every optimisation of the
generator; ``compiled=False`` the schedule's own statements each emitted on its own: the
reference. The executor owns the stores, the iteration hooks of the outer loop, snapshots and
the heap's policy around a run.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from timerl.errors import TimerlError
from timerl.ir.graph import Op
from timerl.runtime import heap
from timerl.runtime.backend import Backend
from timerl.runtime.codegen import CodeGen
from timerl.runtime.heap import TRIM_PEAK, HeapTrim, release_free_heap
from timerl.runtime.store_plan import StorePlan
from timerl.runtime.stores import BlockStore, SwappablePoints, TierMeter
from timerl.runtime.streams import StreamStore
from timerl.schedule.fused import FusedSchedule, FusedStmt
from timerl.schedule.program import Loop, Schedule
from timerl.symbolic import Bound


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
        # False: numpy's huge-page advice is off while this runs (``heap.numpy_huge_pages``)
        self.huge_page_advice = huge_page_advice
        # runtime/heap.py; not under a memory budget, nor where arrays mapped apart hold most
        # of the peak (``memory/heap_policy.py``)
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
        # False: the reference, the schedule's own statements each emitted on its own
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
        self._trim = HeapTrim()
        self.dynamic_values: dict[Bound, dict[tuple, int]] = {b: {} for b in self.dynamic}
        self._start = 0
        self._on_iteration: Callable[[int], None] | None = None
        self._before_outer: Callable[[], None] | None = None

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
        if hooked:
            self.outer_loop()  # (a program without one outer loop is refused here)
        self._start, self._on_iteration, self._before_outer = start, on_iteration, before_outer
        self.backend.reset_device_peak()  # stats() reports this run's peak
        # iterations reuse each other's arrays
        heap.keep_freed_pages(self.keep_freed_pages, self.reuse_up_to)
        try:
            with heap.numpy_huge_pages_off(not self.huge_page_advice), self.backend.active():
                self.prepare(hooked)
                self._trim.start(reserved=self._reserved > 0)
                self._run_compiled(hooked)
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
        if hooked not in self._generated:
            outer: FusedStmt | None = self.outer_loop() if hooked else None
            body = None
            if self.fused is not None and self.compiled:
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
                reference=not self.compiled,
            )
            # What compiling frees goes back to the system, unless the run's pages are
            # reserved: its first iteration fills those holes in the heap too (torch's
            # arrays, about 9 MiB on synthetic-e16), and would fault each page in again.
            # Where they are not, holes that the run's arrays fill stay resident after their
            # free, counted by no meter: the run function is compiled apart from that heap.
            # (the reference run leaves the heap as it is)
            apart = self.compiled and not reserving
            self._generated[hooked] = gen.generate(self.bounds, outer, apart=apart)
            self.source = gen.source
            del gen
            if apart:
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
        found = self.schedule.outer_loop()
        if found is None:
            loops = [s for s in self.schedule.body if isinstance(s, Loop)]
            if loops:
                outer = min((s.dim for s in loops), key=lambda d: d.uid)
                loops = [s for s in loops if s.dim is outer]
            raise TimerlError(
                f"the program has {len(loops)} forward top-level loops over its outer dim; "
                "iteration hooks and resuming need exactly one"
            )
        return found

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


__all__ = ["Executor", "MemoryMeter", "RunStats", "TimerlError"]
