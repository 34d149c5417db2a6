"""``plan_memory``: where each buffer of a scheduled program lives, and when it is freed,
donated or moved. One place to read the whole memory plan, in the order it is made:

1. frees after each buffer's last reader (``memory/liveness.py``);
2. storage: point stores, blocks preallocated along a loop, circular buffers, views and
   aliases of blocks (``memory/storage.py``; an optimised program only);
3. donation: an elementwise op writes into an input that dies at it (``memory/donation.py``);
4. under a memory budget: idle blocks swapped to the next tier, blocks read by rows streamed
   from files, optimiser state and idle values sent to disk between uses, each kept where the
   replayed peak drops (``memory/budget.py``, ``memory/streams.py``, ``memory/point_swap.py``);
   without one, on a backend that swaps points, state of 1 MiB or more goes to disk where
   that lowers the peak.

What a backend can do is asked of its ``Capabilities``, never of its name. How the run's heap
is to be used follows from the plan too (``memory/heap_policy.py``). Running computations over
many rows in blocks, the last resort of a budget, rewrites the program, so the compiler's
pipeline drives that search and calls this again for each block count.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from timerl.ir.graph import Op
from timerl.memory.budget import plan_swaps
from timerl.memory.donation import plan_donations
from timerl.memory.liveness import add_frees
from timerl.memory.point_swap import plan_point_swaps, point_swap_moves
from timerl.memory.replay import PlannedPeak
from timerl.memory.storage import Storage, plan_storage
from timerl.memory.streams import plan_streams
from timerl.schedule.program import Loop, Schedule
from timerl.symbolic import Bound

T = TypeVar("T")
Timed = Callable[[str, Callable[[], T]], T]

# Without a budget, a value moves to disk only from this size up: a move costs a write and a
# read of the value at every update, which a smaller one would not repay in memory.
UNBUDGETED_SWAP_MIN_BYTES = 1 << 20
SEARCH_ITERATIONS = 3  # of an outermost loop, where the moves without a budget are chosen


@dataclass(frozen=True)
class Capabilities:
    """What the backend that will run a program can do, as memory planning and fusion
    (``compiler/fusion.py``) ask it."""

    # point values (optimiser state, idle gradients) written to disk and read back (numpy)
    swaps_points: bool = False
    # kernels that read a block's rows from a file by chunks (numpy's row sources)
    streams_rows: bool = False
    # arrays written in place: block stores' rows and views of them (not jax's immutable ones,
    # which the run keeps as point stores)
    mutable_arrays: bool = True
    # primitives whose lowering writes its result into a dying input (``out=``)
    donating: frozenset[str] = frozenset()
    # the run's arrays come from the process's C heap (numpy's, torch's on the CPU)
    heap_arrays: bool = False
    # what the backend compiles as one call: a run of pure statements (``Backend.fuse``), a
    # whole loop (``fuse_loop``), one iteration of a loop, inner loops included (``fuse_body``)
    fuses_regions: bool = False
    fuses_loops: bool = False
    fuses_bodies: bool = False
    # per primitive, the per-point attributes its lowering takes as traced values
    traced_attrs: Mapping[str, Any] = field(default_factory=dict, hash=False)
    # a small region in a loop stepping the host may run as numpy kernels (jax on the CPU)
    numpy_regions: bool = False

    def donations(self, table: Mapping[int, int], ops: list[Op]) -> dict[int, int]:
        """The entries of a donation table this backend can lower."""
        prim_of = {op.id: op.prim for op in ops}
        return {i: k for i, k in table.items() if prim_of.get(i) in self.donating}

    def planned_storage(self, storage: Mapping[int, Storage]) -> Mapping[int, Storage]:
        """The storage the run will use: a backend of immutable arrays keeps point stores."""
        return storage if self.mutable_arrays else {}


@dataclass(frozen=True)
class MemoryPlan:
    """The memory half of a compiled program: storage kinds (op id -> storage; point stores
    are left out), donations (op id -> the input position whose buffer it writes), and the
    planned peak where a budget made one."""

    storage: Mapping[int, Storage] = field(default_factory=dict)
    donations: Mapping[int, int] = field(default_factory=dict)
    planned: PlannedPeak | None = None


@dataclass(frozen=True)
class Program:
    """What memory planning reads of the compiled program."""

    ops: list[Op]
    static: Mapping[Bound, int]
    dynamic: Mapping[Bound, int | None]
    keep: set[int]


def plan_memory(
    sched: Schedule,
    program: Program,
    capabilities: Capabilities,
    timed: Timed,
    notes: list[str],
    optimize: bool = True,
    budget: int | None = None,
) -> tuple[Schedule, MemoryPlan]:
    """The schedule with its memory statements, and the plan; each step timed and noted."""
    ops, keep = program.ops, program.keep
    bare = sched
    sched = timed("memory statements", lambda: add_frees(bare, ops, keep))
    if not optimize:
        return _fitted(sched, MemoryPlan(), program, capabilities, timed, notes, budget, False)
    sched, storage = timed("storage", lambda: plan_storage(bare, sched, ops, program.static, keep))
    blocks = sum(1 for s in storage.values() if s.kind == "block")
    rings = sum(1 for s in storage.values() if s.kind == "ring")
    if blocks or rings:
        views = sum(1 for s in storage.values() if s.kind == "view")
        notes.append(
            f"storage: {blocks} block stores, {views} views of blocks, {rings} circular buffers"
        )
    donations = timed("donation", lambda: plan_donations(sched, ops, storage, keep))
    if donations:
        notes.append(f"donation: {len(donations)} ops write into a dead input's buffer")
    plan = MemoryPlan(storage, donations)
    return _fitted(sched, plan, program, capabilities, timed, notes, budget, True)


def _fitted(
    sched: Schedule,
    plan: MemoryPlan,
    program: Program,
    capabilities: Capabilities,
    timed: Timed,
    notes: list[str],
    budget: int | None,
    optimize: bool,
) -> tuple[Schedule, MemoryPlan]:
    if budget is not None:
        return fit(sched, plan, program, capabilities, budget, timed, notes)
    if optimize and capabilities.swaps_points:
        sched = swap_idle_state(sched, plan, program, capabilities, timed, notes)
    return sched, plan


def fit(
    sched: Schedule,
    plan: MemoryPlan,
    program: Program,
    capabilities: Capabilities,
    budget: int,
    timed: Timed,
    notes: list[str],
) -> tuple[Schedule, MemoryPlan]:
    """The plan with idle blocks swapped out and, where kernels read rows from files, blocks
    read only by rows streamed, where that brings the planned peak under ``budget``; then
    state and idle values sent to disk where that lowers it further (each costs a write and a
    read, so within the budget or not)."""
    ops, static, dynamic = program.ops, program.static, program.dynamic
    donations = capabilities.donations(plan.donations, ops)

    def step(label: str, run: Callable[[], tuple[Any, PlannedPeak, list[str]]]) -> tuple:
        made, planned, found = timed(label, run)
        notes.extend(found)
        return made, planned

    planned_storage = capabilities.planned_storage(plan.storage)
    sched, planned = step(
        "memory budget",
        lambda: plan_swaps(sched, ops, planned_storage, static, dynamic, budget, donations),
    )
    storage = plan.storage
    over = planned.peak_bytes is not None and planned.peak_bytes > budget
    if capabilities.streams_rows and over:
        storage, planned = step(
            "streaming to disk",
            lambda: plan_streams(
                sched, ops, storage, static, dynamic, budget, donations, program.keep
            ),
        )
    if capabilities.swaps_points and planned.peak_bytes is not None:
        sched, planned = step(
            "points to disk",
            lambda: plan_point_swaps(sched, ops, storage, static, dynamic, donations, program.keep),
        )
    return sched, dataclasses.replace(plan, storage=storage, planned=planned)


def swap_idle_state(
    sched: Schedule,
    plan: MemoryPlan,
    program: Program,
    capabilities: Capabilities,
    timed: Timed,
    notes: list[str],
) -> Schedule:
    """Without a budget: optimiser state idle across the program's peak, and gradients idle
    inside the backward pass, go to disk between their uses where that lowers the planned
    peak (``memory/point_swap.py``), as under a budget; nothing else of a budget's plan (no
    reuse left out, no streaming, the heap kept for speed). On memory-e8 the first layers'
    Adam moments are 12 MiB held through the rollout and the backward pass, where the peak
    is; each is read once per update. Moved: 3 moments and 1 gradient, a write and a read of
    12 MiB per update, for a planned peak of 396.8 MiB instead of 403.7.

    Each move tried is a replay of the plan, and a replay walks every iteration of a loop
    holding a swap (``memory/steady.py`` does not apply to those): memory-e8 compiled for 201
    iterations took 68 s to search. The moves are chosen on the first ``SEARCH_ITERATIONS``
    of each outermost loop (a training loop's first iteration, one in the middle and its
    last, which its other iterations repeat), and the program then plans its whole run."""
    ops, keep = program.ops, program.keep
    static = dict(program.static)
    for s in sched.body:
        if isinstance(s, Loop) and static.get(s.dim.bound, 0) > SEARCH_ITERATIONS:
            static[s.dim.bound] = SEARCH_ITERATIONS
    moves = point_swap_moves(sched, ops, plan.storage, static, keep, UNBUDGETED_SWAP_MIN_BYTES)
    if not moves:  # most programs: their state is small (CartPole's PPO: no value of 1 MiB)
        return sched
    swapped, _, found = timed(
        "points to disk",
        lambda: plan_point_swaps(
            sched,
            ops,
            plan.storage,
            static,
            program.dynamic,
            capabilities.donations(plan.donations, ops),
            keep,
            moves=moves,
            quick=True,
        ),
    )
    notes.extend(found)
    # the plan is left to the program: without a budget it is replayed with the heap's view
    # (arrays it serves, blocks whose rows a run keeps), which a budget's plan leaves out
    return swapped
