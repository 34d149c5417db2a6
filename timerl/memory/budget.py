"""The memory a schedule needs, known before it runs, and the budget check on it.

``planned_peak`` replays the schedule's compute and memory statements with the program's
static bounds, counting what the run's meter counts: each point's bytes from its static
shape, a block's rows once when its loop starts, views and aliases of blocks nothing, and a
donated result (``memory/donation.py``) the bytes its dead input hands over, nothing new. A
training program's outer loop repeats the same work: a top-level loop around other loops
stops being replayed once its live bytes are equal after ``MAX_OUTER`` consecutive
iterations (a heuristic: an iteration whose guards pick other branches later is not seen). A
long loop's iterations that repeat the one before (a rollout's steps) are applied by their net
effect instead of replayed, up to where its guards or kept points turn (``_Steady``,
``memory/steady.py``): exactly the full replay's plan, at a cost that no longer grows with
the loop's length. A dynamic dim is replayed to its cap; one without a cap makes the peak
unknown (``None``).

``check_budget`` turns a peak over ``ctx.compile(memory_budget=...)`` into a compile-time
``MemoryBudgetError`` naming the smallest budget that fits and the tensor holding the most
bytes at the peak, so a program that would not fit never starts.

Under a budget the peak exceeds, two moves are tried, each kept only where the replayed peak
drops: ``plan_swaps`` writes a whole idle block to disk and reads it back before its next
reader; ``plan_streams`` keeps a block read only by rows (``streamable``) in a file for good,
each row written as it is computed and read back by the chunk (``runtime/stores.py``). The
chunks are memory: ``read_buffers`` gives each op reading a streamed block by chunks the
bytes it holds while it runs (two chunks where the next is read ahead), which the replay and
the run's meter count, and ``_fit_reads`` makes them smaller where they set the peak.
"""

from __future__ import annotations

import bisect
import dataclasses
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from timerl.errors import MemoryBudgetError
from timerl.ir import rowwise
from timerl.ir.graph import Op
from timerl.memory.donation import aliasing_merges, owned_merges
from timerl.memory.steady import turning_points
from timerl.memory.storage import Storage
from timerl.schedule.program import (
    Compute,
    Free,
    Loop,
    Position,
    Schedule,
    Stmt,
    SwapIn,
    SwapOut,
    idle_gaps,
    rewrite,
)
from timerl.symbolic import TRUE, Bound, Slice, Symbol

MAX_OUTER = 3  # equal ends of a training loop's iterations after which it is not replayed
# A loop of at least this many iterations is watched for iterations that repeat each other
# (``_Steady``); shorter ones cost little to replay whole.
STEADY_MIN = 16

_UNITS = {
    "": 1,
    "b": 1,
    "k": 2**10,
    "kb": 10**3,
    "kib": 2**10,
    "m": 2**20,
    "mb": 10**6,
    "mib": 2**20,
    "g": 2**30,
    "gb": 10**9,
    "gib": 2**30,
    "t": 2**40,
    "tb": 10**12,
    "tib": 2**40,
}


def parse_bytes(value: int | str) -> int:
    """Bytes from an int or a string such as ``"256MiB"``, ``"1.5GB"``, ``"4096"``."""
    if isinstance(value, bool):
        raise MemoryBudgetError(f"memory budget {value!r} is not a size")
    if isinstance(value, (int, np.integer)):
        n = int(value)
    else:
        m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*", str(value))
        unit = m.group(2).lower() if m else None
        if m is None or unit not in _UNITS:
            raise MemoryBudgetError(
                f"memory budget {value!r} is not a size: write bytes or e.g. '256MiB', '2GB'"
            )
        n = int(float(m.group(1)) * _UNITS[unit])
    if n <= 0:
        raise MemoryBudgetError(f"memory budget {value!r} must be positive")
    return n


def format_bytes(n: int) -> str:
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n} B"


@dataclass(frozen=True)
class PlannedPeak:
    """The peak of live bytes the schedule reaches, and who holds them then."""

    peak_bytes: int | None  # None: not known before the run (see ``note``)
    holders: list[tuple[str, int]] = field(default_factory=list)  # (tensor, bytes), largest first
    note: str = ""
    # the peak without the chunks of streamed reads, and the most bytes live while each op
    # that reads a streamed block by chunks runs: the peak under other chunk sizes is known
    # from these without replaying again (``_fit_reads``)
    peak_apart_reads: int = 0
    live_at_reads: dict[int, int] = field(default_factory=dict)
    peak_at: str = ""  # the op whose statement reaches the peak: where to look to lower it
    # the peak counting only arrays of at most ``planned_peak``'s ``small`` bytes: the ones a
    # C heap serves from pages it keeps (larger ones are mapped apart), which a run can fault
    # in before its first iteration (``runtime/heap.reserve``)
    peak_small_bytes: int = 0
    # blocks above ``small`` bytes whose rows a run may keep while the block is dead, for its
    # next allocation (``BlockStore.keep_spare``): live bytes plus those rows stay within the
    # peak at every statement, so keeping them raises nothing
    spare_blocks: frozenset[int] = frozenset()
    # the id of the op ``peak_at`` names (None: none): a run whose heap keeps no freed pages
    # (under a budget, or a peak mostly of arrays mapped apart) gives the heap's free pages back
    # right before it (``runtime/heap.trim_before_peak``)
    peak_op: int | None = None


def planned_peak(
    sched: Schedule,
    ops: Iterable[Op],
    storage: Mapping[int, Storage],
    static: Mapping[Bound, int],
    dynamic: Mapping[Bound, int | None],
    donations: Mapping[int, int] | None = None,
    small: int = 0,
) -> PlannedPeak:
    ops = list(ops)
    donations = donations or {}
    # merges computed without allocating: no peak there
    quiet = aliasing_merges(ops, owned_merges(donations, {op.id: op for op in ops}))
    env: dict[Symbol, int] = {b: int(v) for b, v in static.items()}
    for b, cap in dynamic.items():
        if cap is None:
            return PlannedPeak(None, note=f"{b.name} is dynamic without a cap")
        env[b] = int(cap)
    labels = {op.id: op.label for op in ops}
    domains = {op.id: tuple(op.domain) for op in ops}
    skipped = [0]  # iterations applied by their net effect, not replayed
    live: dict[int, dict[tuple, int]] = {}
    per_op: dict[int, int] = {}
    state: dict = {"total": 0, "peak": 0, "at_peak": {}, "at": "", "stmt": "", "applying": False}
    notes: list[str] = []
    heap = [0, 0]  # live bytes in arrays of at most ``small`` bytes, and their peak
    # blocks above ``small`` bytes that could keep their rows while dead: op id -> bytes
    # (filled once the blocks are known); the most bytes live plus the rows of each one kept
    # alone, and of all of them kept together; stores with two blocks live at once
    spares: dict[int, int] = {}
    alone: dict[int, int] = {}
    together = [0]
    refused: set[int] = set()

    def note_spares() -> None:
        total = state["total"]
        dead = 0
        for i, n in spares.items():
            if not per_op.get(i):
                dead += n
                alone[i] = max(alone.get(i, 0), total + n)
        together[0] = max(together[0], total + dead)

    # the events of the iterations being watched (``_Steady``), innermost loop last
    recorders: list[list[tuple]] = []

    def add(op_id: int, key: tuple, n: int, peak: bool = True) -> None:
        points = live.setdefault(op_id, {})
        old = points.get(key, 0)
        points[key] = n
        if recorders:
            event = ("a", op_id, key, old, n)
            for r in recorders:
                r.append(event)
        per_op[op_id] = per_op.get(op_id, 0) + n - old
        state["total"] += n - old
        heap[0] += (n if n <= small else 0) - (old if old <= small else 0)
        heap[1] = max(heap[1], heap[0])
        state["apart"] = max(state.get("apart", 0), state["total"])
        if spares:
            if per_op[op_id] > spares.get(op_id, per_op[op_id]):
                refused.add(op_id)  # rows kept when one block is freed would not be dead
            note_spares()
        # an applied iteration's moments never reach above what the iteration replayed after
        # it reaches (``_Steady``), which then names the statement and the holders
        if peak and state["total"] > state["peak"] and not state["applying"]:
            state["peak"] = state["total"]
            state["at_peak"] = {k: v for k, v in per_op.items() if v}
            state["at"], state["at_id"] = state["stmt"], state.get("stmt_id")

    at_reads: dict[int, int] = {}

    def transient(op_id: int, what: int, n: int) -> None:
        at_reads[op_id] = max(at_reads.get(op_id, 0), state["total"])
        if recorders:
            event = ("t", op_id, what, 0, n)
            for r in recorders:
                r.append(event)
        if spares:
            state["total"] += n
            note_spares()
            state["total"] -= n
        if state["total"] + n > state["peak"]:
            state["peak"] = state["total"] + n
            state["at_peak"] = {k: v for k, v in per_op.items() if v}
            state["at_peak"][what] = n
            state["at"], state["at_id"] = state["stmt"], state.get("stmt_id")

    def drop(op_id: int, keys: list[tuple]) -> None:
        points = live.get(op_id, {})
        for key in keys:
            if recorders:  # a key not there is recorded too: it was looked for
                event = ("d", op_id, key, points.get(key, 0), 0)
                for r in recorders:
                    r.append(event)
            n = points.pop(key, 0)
            per_op[op_id] = per_op.get(op_id, 0) - n
            state["total"] -= n
            heap[0] -= n if n <= small else 0

    def nbytes(op: Op) -> int:
        size = 1
        for s in op.shape:
            size *= int(s.evaluate(env))
        return size * np.dtype(op.dtype).itemsize

    blocks_of: dict[int, list[Op]] = {}
    swapped: dict[tuple, int] = {}  # (op id, outer) -> bytes on disk

    def find_blocks(body: list[Stmt], loop: Loop | None) -> None:
        for s in body:
            if isinstance(s, Loop):
                find_blocks(s.body, s)
            elif isinstance(s, Compute) and loop is not None:
                st = storage.get(s.op.id)
                if st is not None and st.kind in ("block", "ring"):
                    blocks_of.setdefault(id(loop), []).append(s.op)

    find_blocks(sched.body, None)
    if small:
        for found in blocks_of.values():
            for op in found:
                st = storage[op.id]
                if st.kind == "block" and not st.streamed:
                    n = nbytes(op) * int(st.extent or 0)
                    if n > small:
                        spares[op.id] = n
        note_spares()

    def run(body: list[Stmt], depth: int) -> None:
        for s in body:
            if isinstance(s, Compute):
                op = s.op
                st = storage.get(op.id, _POINT)
                if st.kind != "point" and not st.read_bytes:
                    continue
                if op.guard != TRUE and not op.guard.evaluate(env):
                    continue
                state["stmt"], state["stmt_id"] = op.label, op.id
                if st.kind == "point":
                    if op.id in donations:  # the dead input's point becomes this op's
                        e = op.inputs[donations[op.id]]
                        drop(e.src.id, [tuple(int(x.evaluate(env)) for x in e.index)])
                    add(op.id, tuple(env[d] for d in op.domain), nbytes(op), op.id not in quiet)
                if st.read_bytes:  # the chunks its kernel reads a streamed block into
                    labels[-1 - op.id] = f"{op.label}'s chunks of streamed rows"
                    transient(op.id, -1 - op.id, st.read_bytes)
            elif isinstance(s, Free):
                free(s)
            elif isinstance(s, SwapOut):
                key = tuple(int(p.evaluate(env)) for p in s.prefix)
                points = live.get(s.op.id, {})
                gone = [k for k in points if k[: len(key)] == key]
                swapped.update({(s.op.id, k): points[k] for k in gone})
                drop(s.op.id, gone)
            elif isinstance(s, SwapIn):
                key = tuple(int(p.evaluate(env)) for p in s.prefix)
                back = [sk for sk in swapped if sk[0] == s.op.id and sk[1][: len(key)] == key]
                for sk in back:
                    add(s.op.id, sk[1], swapped.pop(sk))
            elif isinstance(s, Loop):
                for op in blocks_of.get(id(s), []):
                    st = storage[op.id]
                    if st.streamed:  # its rows go to a file as they are computed
                        continue
                    outer = tuple(env[d] for d in op.domain[:-1])
                    add(op.id, outer, nbytes(op) * int(st.extent or 0))
                extent = env[s.dim.bound]
                points = range(extent) if s.forward else range(extent - 1, -1, -1)
                # a top-level loop around loops (a training loop) whose live bytes are the
                # same after consecutive iterations repeats itself: stop replaying it
                outer = depth == 0 and any(isinstance(x, Loop) for x in s.body)
                steady = None
                if not outer and extent >= STEADY_MIN:
                    turns = turning_points(s, env, donations, storage)
                    if turns is not None:
                        steady = _Steady(s.dim, points, turns, domains)
                ends: list[int] = []
                k = 0
                while k < extent:
                    env[s.dim] = points[k]
                    if steady is not None:
                        recorders.append([])
                    run(s.body, depth + 1)
                    ends.append(state["total"])
                    if outer and k + 1 >= MAX_OUTER and ends[-1] == ends[-2] == ends[-3]:
                        if k + 1 < extent:
                            notes.append(
                                f"{k + 1} of {extent} iterations over {s.dim.name} (the live "
                                "bytes no longer change from one to the next)"
                            )
                        break
                    if steady is not None:
                        repeats = steady.watch(k, recorders.pop())
                        done = 0
                        while done < repeats and repeat(*steady.at(k + 1 + done)):
                            done += 1
                        skipped[0] += done
                        k += done
                    k += 1
                env.pop(s.dim, None)

    def repeat(found: list[tuple[int, tuple, int]], net: list[tuple[int, tuple, int, int]]) -> bool:
        """Apply a watched iteration's net effect (``_Steady.at``) where every point it looked
        at is as it found it (else replay): what it frees first, so no moment counts both."""
        for op_id, key, before in found:
            if live.get(op_id, {}).get(key, 0) != before:
                return False
        state["applying"] = True
        for op_id, key, before, after in net:
            if before and not after:
                drop(op_id, [key])
        for op_id, key, _, after in net:
            if after:
                add(op_id, key, after)
        state["applying"] = False
        return True

    def free(s: Free) -> None:
        op = s.op
        points = live.get(op.id, {})
        if not points and not recorders:
            return
        key = tuple(int(p.evaluate(env)) for p in s.prefix)
        if s.pinned and key and key[-1] in {int(p.evaluate(env)) for p in s.pinned}:
            return
        if key in points:  # one point (or one block): no need to look through the others
            drop(op.id, [key])
            return
        n = len(key)
        under = [k for k in points if k[:n] == key]
        # nothing to free is an observation too: a repeated iteration must find it so
        drop(op.id, under or [key])

    run(sched.body, 0)
    peak = int(state["peak"])
    if not refused and together[0] <= peak:
        kept = frozenset(spares)
    else:  # the largest block that can be kept alone
        fits = [i for i in spares if i not in refused and alone.get(i, 0) <= peak]
        kept = frozenset(sorted(fits, key=lambda i: -spares[i])[:1])
    # largest first, ties by name: the same list however the replay reached the peak
    holders = sorted(
        ((labels[i], b) for i, b in state["at_peak"].items()), key=lambda kv: (-kv[1], kv[0])
    )
    if skipped[0]:
        notes.append(f"{skipped[0]} iterations that repeat the one before applied, not replayed")
    note = "replayed " + ", ".join(dict.fromkeys(notes)) if notes else "replayed in full"
    return PlannedPeak(
        int(state["peak"]),
        holders,
        note,
        int(state.get("apart", 0)),
        at_reads,
        state["at"],
        heap[1],
        kept,
        state.get("at_id"),
    )


_POINT = Storage("point", "")


class _Steady:
    """Watches a long loop's replay for iterations that repeat the one before it.

    An iteration's events (points added and freed, reads' chunks) are compared with the
    previous ones', keys taken relative to the loop's point. Once ``window`` consecutive
    iterations are equal, where ``window`` spans the farthest point an event reaches back or
    ahead (so every point an iteration frees was added by one of them), the following
    iterations up to the next turning point (``steady.turning_points``) evaluate the same
    branches on the same live points, so they do the same: each is applied by its net effect
    (the points it leaves added or freed), not replayed. The last iteration before a turning
    point is replayed in full: where live bytes grow from one iteration to the next its moments
    are the highest of the run of repeats, and where they fall the watched ones were, so the
    peak, and who holds it, are those of a full replay.
    """

    MAX_EVENTS = 20_000  # an iteration with more (a long inner loop) is not watched
    MAX_REACH = 32  # nor one whose events reach farther from its point than this

    def __init__(
        self,
        dim: Symbol,
        points: Sequence[int],
        turns: list[int],
        domains: Mapping[int, tuple],
    ) -> None:
        self.points = points
        step = points[1] - points[0]
        # turning points as iteration numbers, in the order the loop runs them
        self.turns = sorted((v - points[0]) // step for v in turns)
        self.domains = domains
        self.dim = dim
        self.seen: list[tuple] = []
        # the watched iteration's net effect and the points it looked at, each key split
        # around its coordinate along the loop's dim (``_split``)
        self.changes: list[tuple] = []
        self.looked: list[tuple] = []
        self.positions: dict[int, tuple[int, ...]] = {}

    def _at(self, op_id: int) -> tuple[int, ...]:
        pos = self.positions.get(op_id)
        if pos is None:
            dom = self.domains.get(op_id, ())
            pos = self.positions[op_id] = tuple(j for j, d in enumerate(dom) if d is self.dim)
        return pos

    def _shift(self, op_id: int, key: tuple, by: int) -> tuple:
        pos = self._at(op_id)
        if not pos:
            return key
        return tuple(c + by if j in pos else c for j, c in enumerate(key))

    def watch(self, k: int, events: list[tuple]) -> int:
        """How many iterations after ``k`` repeat it (0: replay the next one)."""
        if len(events) > self.MAX_EVENTS:
            self.seen.clear()
            return 0
        p = self.points[k]
        reach = 0
        sig = []
        for kind, op_id, key, old, n in events:
            if kind != "t":
                key = self._shift(op_id, key, -p)
                pos = self._at(op_id)
                reach = max([reach, *(abs(key[j]) for j in pos)])
            sig.append((kind, op_id, key, old, n))
        window = reach + 2
        if reach > self.MAX_REACH:
            self.seen.clear()
            return 0
        self.seen.append(tuple(sig))
        if len(self.seen) < window or any(x != self.seen[-1] for x in self.seen[-window:]):
            del self.seen[: -self.MAX_REACH - 2]
            return 0
        # repeats run up to the iteration before the next turning point, which is replayed
        nxt = bisect.bisect_left(self.turns, k)
        stop = self.turns[nxt] if nxt < len(self.turns) else len(self.points)
        repeats = min(stop, len(self.points)) - 2 - k
        if repeats < 2:
            return 0
        first: dict[tuple[int, tuple], int] = {}
        last: dict[tuple[int, tuple], int] = {}
        looked: list[tuple[int, tuple, int]] = []
        for kind, op_id, key, old, n in sig:
            if kind == "t":
                continue
            if (op_id, key) not in first:
                first[(op_id, key)] = old
                # a point of this loop's dim first added here is this point's: no earlier
                # iteration can have made it; everything else it found is checked again
                if kind != "a" or old or not self._at(op_id):
                    looked.append((op_id, key, old))
            last[(op_id, key)] = n
        self.looked = [(op_id, *self._split(op_id, key), b) for op_id, key, b in looked]
        self.changes = [
            (op_id, *self._split(op_id, key), first[(op_id, key)], after)
            for (op_id, key), after in last.items()
            if first[(op_id, key)] != after
        ]
        self.seen.clear()
        return repeats

    def _split(self, op_id: int, key: tuple) -> tuple[tuple, int | None, tuple]:
        """``key`` around its coordinate along the loop's dim (a dim is in a domain once):
        ``(before, offset, after)``, offset None where the key has none."""
        pos = self._at(op_id)
        if not pos:
            return key, None, ()
        j = pos[0]
        return key[:j], key[j], key[j + 1 :]

    def at(self, k: int) -> tuple[list[tuple[int, tuple, int]], list[tuple[int, tuple, int, int]]]:
        """The watched iteration moved to iteration ``k``: the points it looked at, as
        (op, key, bytes found), and its net effect, as (op, key, bytes before, after)."""
        p = self.points[k]
        found = [
            (op_id, a if c is None else (*a, c + p, *z), b) for op_id, a, c, z, b in self.looked
        ]
        net = [
            (op_id, a if c is None else (*a, c + p, *z), b, n)
            for op_id, a, c, z, b, n in self.changes
        ]
        return found, net


# a loop run at least this many times an iteration of the outermost loop allocates its arrays
# over and over (``repeated_array_bytes``)
REPEATED_POINTS = 16


def repeated_array_bytes(sched: Schedule, static: Mapping[Bound, int]) -> int:
    """The largest array of static shape computed at every point of a loop that runs at least
    ``REPEATED_POINTS`` times an iteration of the outermost loop (a loop of unknown length
    counts as such): an environment's step and its observations, a minibatch's activations.
    Views count, as the arrays they show (a step's observations are views of what the
    environment returned). 0 where there is none."""
    best = 0

    def visit(body: list[Stmt], points: int) -> None:
        nonlocal best
        for s in body:
            if isinstance(s, Loop):
                trips = static.get(s.dim.bound)
                visit(s.body, points * (REPEATED_POINTS if trips is None else trips))
            elif isinstance(s, Compute) and points >= REPEATED_POINTS:
                best = max(best, static_bytes(s.op, {}))  # (no bound: constant shapes only)

    for s in sched.body:  # the outermost loop's own iterations are not repeats within one
        if isinstance(s, Loop):
            visit(s.body, 1)
    return best


def static_bytes(op: Op, static: Mapping[Bound, int]) -> int:
    """Bytes of ``op``'s value with its shape's bounds at ``static``; 0 where its shape needs
    anything else (a loop's dim, a dynamic bound)."""
    n = 1
    for s in op.shape:
        try:
            n *= int(s.evaluate(static))
        except (KeyError, TypeError, ValueError):
            return 0
    return n * np.dtype(op.dtype).itemsize


def check_budget(plan: PlannedPeak, budget: int) -> None:
    """Raise ``MemoryBudgetError`` when the planned peak exceeds ``budget`` bytes."""
    if plan.peak_bytes is None or plan.peak_bytes <= budget:
        return
    top = plan.holders[0] if plan.holders else ("?", 0)
    others = ", ".join(f"{name} {format_bytes(b)}" for name, b in plan.holders[1:4])
    raise MemoryBudgetError(
        f"the program needs {format_bytes(plan.peak_bytes)} ({plan.peak_bytes} bytes) at its "
        f"peak, over the memory budget of {format_bytes(budget)} ({budget} bytes); the "
        f"smallest budget that fits is memory_budget={plan.peak_bytes}. "
        + (f"The peak is reached computing {plan.peak_at}; the " if plan.peak_at else "The ")
        + f"largest tensor live then is {top[0]} ({format_bytes(top[1])})"
        + (f"; next: {others}" if others else "")
        + ". Swapping idle blocks to disk and streaming blocks read by rows do not bring it "
        "lower. Lower the batch "
        "(envs x steps) or the observation size, or raise the budget.",
        smallest=plan.peak_bytes,
    )


def plan_swaps(
    sched: Schedule,
    ops: list[Op],
    storage: Mapping[int, Storage],
    static: Mapping[Bound, int],
    dynamic: Mapping[Bound, int | None],
    budget: int,
    donations: Mapping[int, int] | None = None,
) -> tuple[Schedule, PlannedPeak, list[str]]:
    """Swap block stores to disk where that brings the planned peak under ``budget``.

    A candidate is a block (no alias or view of it) that is idle between two statements of
    the body holding its loop: after the loop that writes it (or a reader) and before its next
    reader. Candidates are tried largest first; a swap is kept when it lowers the peak.
    """
    plan = planned_peak(sched, ops, storage, static, dynamic, donations)
    notes: list[str] = []
    if plan.peak_bytes is None or plan.peak_bytes <= budget:
        return sched, plan, notes
    shared = {s.base for s in storage.values() if s.kind in ("alias", "view")}
    blocks = {i for i, s in storage.items() if s.kind == "block" and i not in shared}
    by_id = {op.id: op for op in ops}
    candidates: list[tuple[int, tuple, int, int]] = []  # (op id, body path, after, before)

    def visit(body: list[Stmt], path: tuple) -> None:
        for k, s in enumerate(body):
            if not isinstance(s, Loop):
                continue
            visit(s.body, path + (k,))
            for x in s.body:
                if isinstance(x, Compute) and x.op.id in blocks:
                    for a, b in idle_gaps(body, k, x.op.id):
                        candidates.append((x.op.id, path, a, b))

    visit(sched.body, ())
    nbytes = {i: int(storage[i].extent or 0) * _row_bytes(by_id[i]) for i in blocks}
    candidates.sort(key=lambda c: -nbytes[c[0]] * (c[3] - c[2]))
    for op_id, path, after, before in candidates:
        op = by_id[op_id]
        trial = _swapped_between(sched, op, (*path, after), (*path, before))
        tried = planned_peak(trial, ops, storage, static, dynamic, donations)
        if tried.peak_bytes is not None and tried.peak_bytes < (plan.peak_bytes or 0):
            sched, plan = trial, tried
            notes.append(f"swap: {op.label} to disk while it is idle")
            if plan.peak_bytes is not None and plan.peak_bytes <= budget:
                break
    return sched, plan, notes


# How the ops that may read a streamed block's rows do so: the pass's own rule tables, one entry
# per primitive (a primitive missing from both reads the block whole, which streaming forbids).
#
# Views that keep a row source (ir/rowwise.py) a row source, given the view, whether the block
# reaches it transposed, and the static bounds: why not, or None.
_ViewRule = Callable[[Op, bool, Mapping[Bound, int]], str | None]


def _keeps_rows(view: Op, transposed: bool, static: Mapping[Bound, int]) -> str | None:
    if transposed or not view.shape or not _splits_rows(view, static):
        return f"{view.label} reshapes its rows"
    return None


def _transposes_rows(view: Op, transposed: bool, static: Mapping[Bound, int]) -> str | None:
    if tuple(view.attrs.get("perm", ())) != (1, 0) or transposed:
        return f"{view.label} permutes its axes"
    return None


_ROW_VIEWS: dict[str, _ViewRule] = {
    "identity": _keeps_rows,
    "detach": _keeps_rows,
    "reshape": _keeps_rows,
    "permute": _transposes_rows,
}


@dataclass(frozen=True)
class _RowReader:
    """A kernel that reads its first operand, a row source, a chunk at a time."""

    # why it cannot read this source (given the reader, whether the source is the block's
    # transpose, and the source), or None
    declines: Callable[[Op, bool, Op], str | None]
    # whether it reads the rows as a transpose, holding a slab of its result (given the
    # reader and whether the source is transposed)
    flips: Callable[[Op, bool], bool]
    # rows it reads in all, of a source of ``nrows`` rows (a gather may read some twice)
    rows_read: Callable[[Op, Mapping[Bound, int], int], int]


def _matmul_declines(reader: Op, transposed: bool, source: Op) -> str | None:
    if len(reader.inputs[1].src.shape) != 2:
        return f"{reader.label} multiplies it by a batch of matrices"
    if transposed and len(source.shape) != 2:
        return f"{reader.label} multiplies its transpose as a batch"
    return None


def _take_matmul_declines(reader: Op, transposed: bool, source: Op) -> str | None:
    return f"{reader.label} gathers from its transpose" if transposed else None


def _every_row(reader: Op, env: Mapping[Bound, int], nrows: int) -> int:
    return nrows


def _gathered_rows(reader: Op, env: Mapping[Bound, int], nrows: int) -> int:
    return int(np.prod([int(x.evaluate(env)) for x in reader.inputs[1].src.shape]))


_ROW_READERS: dict[str, _RowReader] = {
    "matmul": _RowReader(_matmul_declines, lambda _r, transposed: transposed, _every_row),
    "take_matmul": _RowReader(
        _take_matmul_declines,
        lambda reader, _t: bool(reader.attrs.get("trans", False)),
        _gathered_rows,
    ),
}


def streamable(
    op_id: int,
    ops: list[Op],
    storage: Mapping[int, Storage],
    static: Mapping[Bound, int],
    keep: frozenset[int] | set[int] = frozenset(),
) -> str | None:
    """None when every reader of block ``op_id`` can read it by rows, else why not.

    The block, and each alias of it, is read at single points (one row, read back from the
    file) or as a whole slice by a view; a view (a row source) is read by views that keep
    its rows (``_ROW_VIEWS``) and as the first operand of a kernel that reads it by chunks
    (``_ROW_READERS``)."""
    by_id = {op.id: op for op in ops}
    family, transposed = _family(op_id, by_id, storage)
    kept = sorted(family & set(keep))
    if kept:
        return f"{by_id[kept[0]].label} is an output (its values outlive the run)"
    readers: dict[int, list[tuple[Op, int]]] = {}
    for op in ops:
        for k, e in enumerate(op.inputs):
            if e.src.id in family:
                readers.setdefault(e.src.id, []).append((op, k))
    for fid in sorted(family):  # the same reason named, whatever the ids hash to
        kind = storage[fid].kind
        whole = kind == "view"
        for reader, k in readers.get(fid, []):
            edge = reader.inputs[k]
            sliced = any(isinstance(i, Slice) for i in edge.index)
            if reader.id in family:
                if storage[reader.id].kind == "alias":
                    continue
                view_rule = _ROW_VIEWS.get(reader.prim)
                if view_rule is None:
                    return f"{reader.label} views it as {reader.prim}"
                why = view_rule(reader, transposed[fid], static)
                if why is not None:
                    return why
                continue
            if not whole and not sliced:
                continue  # one row, read back from the file
            if not whole and any(isinstance(i, Slice) for i in edge.index[:-1]):
                return f"{reader.label} ({reader.prim}) reads a slice across its blocks"
            rule = _ROW_READERS.get(reader.prim)
            if (sliced and whole) or k != 0 or rule is None:
                what = "a slice of it" if sliced else "it whole"
                return f"{reader.label} ({reader.prim}) reads {what}"
            why = rule.declines(reader, transposed[fid], by_id[fid])
            if why is not None:
                return why
    return None


def _family(
    op_id: int, by_id: Mapping[int, Op], storage: Mapping[int, Storage]
) -> tuple[set[int], dict[int, bool]]:
    """Block ``op_id``, its aliases and views, and which of those are its 2-D transpose."""
    family = {op_id} | {
        i for i, s in storage.items() if s.kind in ("alias", "view") and s.base == op_id
    }
    transposed: dict[int, bool] = {op_id: False}
    for _ in family:  # a view is transposed when an odd number of permutes lead to it
        for fid in family - {op_id}:
            src = by_id[fid].inputs[0].src.id if by_id[fid].inputs else op_id
            transposed[fid] = transposed.get(src, False) ^ (by_id[fid].prim == "permute")
    return family, transposed


def read_buffers(
    ops: list[Op], storage: Mapping[int, Storage], static: Mapping[Bound, int]
) -> dict[int, int]:
    """Op id -> the bytes its kernel holds reading a streamed block by chunks.

    A kernel of ``_ROW_READERS`` (a matmul, a ``take_matmul``) whose rows are a streamed block
    (a view of it, or a slice of its rows) reads them a chunk at a time (``ir/rowwise.py``): it holds one chunk, two where
    the block is read ahead, and the slab of a transposed product. ``planned_peak`` and the
    run's meter count these bytes while the op runs, on top of what is live then. A read of
    one row holds one row and is not counted."""
    by_id = {op.id: op for op in ops}
    env = {b: int(v) for b, v in static.items()}
    out: dict[int, int] = {}
    streamed = [i for i, s in storage.items() if s.streamed and i in by_id]
    for block in streamed:
        st = storage[block]
        family, transposed = _family(block, by_id, storage)
        for op in ops:
            rule = _ROW_READERS.get(op.prim)
            if rule is None or not op.inputs:
                continue
            edge = op.inputs[0]
            src = edge.src
            if src.id not in family:
                continue
            try:
                shape = [int(x.evaluate(env)) for x in src.shape]
                itemsize = np.dtype(src.dtype).itemsize
                if storage[src.id].kind == "view":
                    flipped = transposed[src.id]
                    if flipped:
                        nrows, row_bytes = shape[-1], shape[0] * itemsize
                    else:
                        nrows, row_bytes = shape[0], int(np.prod(shape[1:])) * itemsize
                elif isinstance(edge.index[-1], Slice):
                    flipped = False
                    nrows, row_bytes = int(st.extent or 0), int(np.prod(shape)) * itemsize
                else:
                    continue  # one row
                flip = rule.flips(op, flipped)
                n = rowwise.read_buffer_bytes(
                    rule.rows_read(op, env, nrows), row_bytes, st.chunk_bytes or None, st.read_ahead
                )
                if flip and len(op.shape) == 2:
                    rows_out, cols = (int(x.evaluate(env)) for x in op.shape)
                    n += rowwise.slab_bytes(rows_out, cols, np.dtype(op.dtype).itemsize)
            except (KeyError, TypeError, ValueError, AttributeError):
                continue  # a shape not known before the run: not counted
            out[op.id] = out.get(op.id, 0) + n
    return out


def with_read_buffers(
    storage: Mapping[int, Storage], ops: list[Op], static: Mapping[Bound, int]
) -> dict[int, Storage]:
    """The table with each op's ``read_bytes`` set from ``read_buffers``."""
    reads = read_buffers(ops, storage, static)
    table = dict(storage)
    for i, st in storage.items():
        if st.read_bytes and i not in reads:
            table[i] = dataclasses.replace(st, read_bytes=0)
    for i, n in reads.items():
        table[i] = dataclasses.replace(table.get(i, _POINT), read_bytes=n)
    return table


def _splits_rows(view: Op, static: Mapping[Bound, int]) -> bool:
    """The view keeps a row source's rows whole: it has a multiple of the rows of its input
    (the whole block's ``extent``, or a view of it) in front (``(T, E, D) -> (T * E, D)``)."""
    src = view.inputs[0]
    env = {b: int(v) for b, v in static.items()}
    try:
        rows = int(view.shape[0].evaluate(env))
        before = src.src.shape
        first = (
            int(src.index[-1].stop.evaluate(env)) - int(src.index[-1].start.evaluate(env))
            if isinstance(src.index[-1], Slice)
            else int(before[0].evaluate(env))
        )
    except (KeyError, TypeError, ValueError, AttributeError):
        return False
    return first > 0 and rows % first == 0


def plan_streams(
    sched: Schedule,
    ops: list[Op],
    storage: Mapping[int, Storage],
    static: Mapping[Bound, int],
    dynamic: Mapping[Bound, int | None],
    budget: int,
    donations: Mapping[int, int] | None = None,
    keep: frozenset[int] | set[int] = frozenset(),
) -> tuple[dict[int, Storage], PlannedPeak, list[str]]:
    """Stream block stores to disk (``Storage.streamed``) where that lowers the planned peak.

    A candidate is a block every reader of which reads it by rows (``streamable``); the
    largest are tried first, and each is kept when the replayed peak drops, until the peak
    fits ``budget``."""
    table = dict(storage)
    plan = planned_peak(sched, ops, table, static, dynamic, donations)
    notes: list[str] = []
    if plan.peak_bytes is None or plan.peak_bytes <= budget:
        return table, plan, notes
    by_id = {op.id: op for op in ops}
    swapped = {s.op.id for s in sched.statements() if isinstance(s, SwapOut)}
    blocks = [
        i
        for i, s in table.items()
        if s.kind == "block" and not s.streamed and i in by_id and i not in swapped
    ]
    blocks.sort(key=lambda i: -int(table[i].extent or 0) * _row_bytes(by_id[i]))
    for op_id in blocks:
        if streamable(op_id, ops, table, static, keep) is not None:
            continue
        st = table[op_id]
        trial = dict(table)
        trial[op_id] = dataclasses.replace(
            st,
            streamed=True,
            chunk_bytes=rowwise.CHUNK_BYTES,
            read_ahead=True,
            why=st.why + "; streamed to disk: rows written as computed, read back by rows",
        )
        trial = with_read_buffers(trial, ops, static)
        tried = planned_peak(sched, ops, trial, static, dynamic, donations)
        if tried.peak_bytes is not None and tried.peak_bytes < (plan.peak_bytes or 0):
            table, plan = trial, tried
            size = format_bytes(int(st.extent or 0) * _row_bytes(by_id[op_id]))
            notes.append(f"stream: {by_id[op_id].label} ({size} a block) streamed to disk")
            if plan.peak_bytes is not None and plan.peak_bytes <= budget:
                break
    if plan.peak_bytes is not None and plan.peak_bytes > budget:
        table, plan, why = _fit_reads(sched, ops, table, plan, static, dynamic, budget, donations)
        notes.extend(why)
    return table, plan, notes


# chunks are halved this many times at most under a tight budget (4 MiB -> 1 MiB): below that
# a transposed product (a weight's gradient, ``X.T @ G``) passes over its whole result once a
# chunk of a few rows, and takes twice as long at 256 KiB as at 4 MiB
SHRINK = 2


def _fit_reads(
    sched: Schedule,
    ops: list[Op],
    table: dict[int, Storage],
    plan: PlannedPeak,
    static: Mapping[Bound, int],
    dynamic: Mapping[Bound, int | None],
    budget: int,
    donations: Mapping[int, int] | None,
) -> tuple[dict[int, Storage], PlannedPeak, list[str]]:
    """Smaller read chunks where the chunks of streamed reads set the peak over ``budget``.

    Tried in order: read ahead with the chunk halved (two chunks in the room of one), down to
    ``CHUNK_BYTES / 2**SHRINK``; then that chunk without reading ahead. The first that fits is
    kept; where none does, the one with the lowest peak (the first of equals), so that the
    budget error names the smallest budget any of them reaches. ``plan`` is the replay of
    ``table``: the chunks add to the peak only while their op runs, so each setting's peak
    follows from it, and only the one kept is replayed."""
    streamed = [i for i, s in table.items() if s.streamed]
    if not streamed or plan.peak_bytes is None:
        return table, plan, []
    chunk = rowwise.CHUNK_BYTES
    settings = [(max(chunk >> k, 1), True) for k in range(SHRINK + 1)]
    settings.append((max(chunk >> SHRINK, 1), False))
    best: tuple[dict[int, Storage], int, tuple[int, bool]] | None = None
    for size, ahead in settings:
        trial = dict(table)
        for i in streamed:
            trial[i] = dataclasses.replace(table[i], chunk_bytes=size, read_ahead=ahead)
        trial = with_read_buffers(trial, ops, static)
        peak = max(
            [plan.peak_apart_reads]
            + [live + trial[i].read_bytes for i, live in plan.live_at_reads.items()]
        )
        if best is None or peak < best[1]:
            best = (trial, peak, (size, ahead))
        if peak <= budget:
            break
    assert best is not None
    trial, _, (size, ahead) = best
    tried = planned_peak(sched, ops, trial, static, dynamic, donations)
    if (size, ahead) == (chunk, True):
        return trial, tried, []
    how = "read ahead" if ahead else "not read ahead (two chunks do not fit)"
    return trial, tried, [f"stream: read in chunks of {format_bytes(size)}, {how}"]


def _swapped_between(sched: Schedule, op: Op, out_at: Position, in_at: Position) -> Schedule:
    """``sched`` with block store ``op`` written to disk after the statement at ``out_at`` and
    read back before the one at ``in_at``."""
    prefix = tuple(op.domain[:-1])

    def edit(s: Stmt, at: Position) -> list[Stmt] | None:
        if at == out_at:
            return [s, SwapOut(op, prefix)]
        if at == in_at:
            return [SwapIn(op, prefix), s]
        return None

    return Schedule(rewrite(sched.body, edit))


def _row_bytes(op: Op) -> int:
    size = 1
    for s in op.shape:
        size *= int(getattr(s, "value", 1))
    return size * np.dtype(op.dtype).itemsize
