"""The memory a schedule needs, known before it runs: ``planned_peak``.

It replays the schedule's compute and memory statements with the program's static bounds,
counting what the run's meter counts: each point's bytes from its static shape, a block's rows
once when its loop starts, views and aliases of blocks nothing, and a donated result
(``memory/donation.py``) the bytes its dead input hands over, nothing new. A training
program's outer loop repeats the same work: a top-level loop around other loops stops being
replayed once its live bytes are equal after ``MAX_OUTER`` consecutive iterations (a
heuristic: an iteration whose guards pick other branches later is not seen). A long loop's
iterations that repeat the one before (a rollout's steps) are applied by their net effect
instead of replayed, up to where its guards or kept points turn (``_Steady``,
``memory/steady.py``): exactly the full replay's plan, at a cost that no longer grows with the
loop's length. A dynamic dim is replayed to its cap; one without a cap makes the peak unknown
(``None``).
"""

from __future__ import annotations

import bisect
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from timerl.errors import MemoryBudgetError
from timerl.ir.graph import Op
from timerl.ir.shapes import static_nbytes
from timerl.memory.donation import aliasing_merges, owned_merges
from timerl.memory.steady import turning_points
from timerl.memory.storage import Storage
from timerl.schedule.program import (
    Compute,
    Free,
    Loop,
    Schedule,
    Stmt,
    SwapIn,
    SwapOut,
)
from timerl.symbolic import TRUE, Bound, Symbol

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
    return static_nbytes(op.shape, op.dtype, static) or 0


def row_bytes(op: Op) -> int:
    size = 1
    for s in op.shape:
        size *= int(getattr(s, "value", 1))
    return size * np.dtype(op.dtype).itemsize
