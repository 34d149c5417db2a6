"""Point values go to disk while nothing reads them: optimiser state between updates, and
values idle inside a body (a layer's gradient during the rest of the backward pass). Under a
memory budget from 64 KiB up; without one too, on numpy, from 1 MiB up.

An optimiser's moment is read once per update, by the Adam step at its end, yet it is live
through everything between: the rollout and the whole forward and backward pass. In the
schedule it is a carried merge at the top of the update's body (``m[i, u]`` is ``m[i]`` at
``u = 0``, else the last update's ``m'[i, u - 1]``), and the step that scales it
(``beta1 * m``) runs right after it, since holding it costs the same wherever it runs. On
memory-e8 the four first-layer moments are 12 MiB of a 32 MiB plan. A move of such a merge:

* the merge, and the chain of ops that read only it and constants (``beta1 * m``), move down
  to right before the first statement that reads the chain's end (the Adam step's sum), with
  the frees of what they read;
* each value the merge picks is read back from disk right before it (``SwapIn``);
* the loop-carried value computed in the same body (``m'[i, u]``) goes to disk right after its
  last reader at its own point; the merge of an outer body it comes through (``m[i]``, from
  the last iteration's ``m'[i - 1, U - 1]``) goes right after it is made, with its branch read
  back before.

A value read only in its own body at its own point, by ops that do not share its buffer
(views, merges), goes to disk across the longest run of statements between two of its uses,
and comes back right before the second: a first layer's gradient, computed early in the
backward pass and read again only by the clipping before the Adam step.

Under any budget, since a move costs a write and a read of the value, not a recomputation,
the moves of at least ``POINT_SWAP_MIN_BYTES`` are tried largest first, carried state first;
one is kept where the replayed peak (``planned_peak``) drops, and a round that keeps one
tries the rest again (two moments live at the peak only let it drop once both go). A value
idle in a body is tried only while the peak holds it: a replay of a long program costs tens
of ms. A move is taken only where every reader of a value sent to disk reads it back first.
Swaps run unguarded: where a merge's guard skips it (the last update's, whose result nobody
reads), its state is read back all the same and freed by the frees after it, as the plan
counts. Nothing changes what is computed: the same statements run, in an order the readers
allow. The op order was chosen for the carried state (``to_graph``'s ``state_on_disk``):
each Adam step's moments in turn. The runtime side is ``runtime/stores.SwappablePoints``
(numpy backend); the generated code keeps such values in their stores, not in locals.

Without a budget (``memory/plan.swap_idle_state``) the same moves are tried with the
compile's own op order (not ordered for the state, and with the rollout's activations reused)
and only where they are likely to lower the peak (``quick``): a value idle in a body only
where the peak's statement runs while it is out, carried state only where its value or its
source is live at the peak, and in one round. That replays memory-e8 6 times rather than 13
(0.1 s each), and passes up a few moves that would lower the peak by a few hundred bytes.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace

from timerl.ir import prims
from timerl.ir.graph import Edge, Op, consumers
from timerl.memory.replay import PlannedPeak, format_bytes, planned_peak, static_bytes
from timerl.memory.storage import Storage
from timerl.schedule.program import (
    Compute,
    Free,
    Loop,
    Position,
    Schedule,
    Start,
    Stmt,
    SwapIn,
    SwapOut,
    idle_gaps,
    reads,
    rewrite,
)
from timerl.schedule.to_graph import POINT_SWAP_MIN_BYTES
from timerl.symbolic import Bound, Slice, always_eq


@dataclass
class _Body:
    """A loop body and the loops enclosing it, innermost last (``loops[-1].body is stmts``)."""

    loops: tuple[Loop, ...]

    @property
    def stmts(self) -> list[Stmt]:
        return self.loops[-1].body


@dataclass(frozen=True)
class _Move:
    """One swap this pass may make: what it moves, how many bytes, whether a replay of it is
    worth its time (the tests below; a replay is not cheap), and the schedule it makes (None
    where it cannot be made safely)."""

    what: str
    nbytes: int
    # whether the value it sends out is live at the plan's peak (carried state: always tried)
    worth: Callable[[Schedule, PlannedPeak], bool]
    # a quicker test that passes fewer moves that would not lower the peak, and a few that
    # would by very little: a value idle in a body sent out across the peak's statement,
    # carried state whose value or whose source is live at the peak
    likely: Callable[[Schedule, PlannedPeak], bool]
    apply: Callable[[Schedule], Schedule | None]


def point_swap_moves(
    sched: Schedule,
    ops: list[Op],
    storage: Mapping[int, Storage],
    static: Mapping[Bound, int],
    keep: frozenset[int] | set[int] = frozenset(),
    min_bytes: int = POINT_SWAP_MIN_BYTES,
) -> list[_Move]:
    """The moves ``plan_point_swaps`` may try, largest first; among equals, carried state
    before values idle in a body. Found without a replay: none found, none is needed."""
    readers = consumers(ops)
    moves: list[_Move] = []
    for m in _carried_merges(sched, storage):
        n = static_bytes(m, static)
        if n >= min_bytes:
            held = _holds(_carried_values(m, readers))
            move = _merge_move(m, readers, storage)
            moves.append(_Move(f"{m.label} to disk between updates", n, _always, held, move))
    for x in _idle_points(sched, storage, readers, keep):
        n = static_bytes(x, static)
        if n >= min_bytes:
            live, likely = _holds(frozenset({x.label})), _idle_at_peak(x)
            what = f"{x.label} to disk while it is idle"
            moves.append(_Move(what, n, live, likely, _idle_move(x)))
    moves.sort(key=lambda mv: -mv.nbytes)
    return moves


def plan_point_swaps(
    sched: Schedule,
    ops: list[Op],
    storage: Mapping[int, Storage],
    static: Mapping[Bound, int],
    dynamic: Mapping[Bound, int | None],
    donations: Mapping[int, int] | None = None,
    keep: frozenset[int] | set[int] = frozenset(),
    moves: list[_Move] | None = None,
    quick: bool = False,
) -> tuple[Schedule, PlannedPeak, list[str]]:
    """``sched`` with carried state and values idle in a body swapped to disk between uses
    wherever that lowers the planned peak; its plan; a note per value moved. ``keep``: the
    values the user keeps (never moved); ``moves``: those to try, as ``point_swap_moves``
    found them (None: every one of at least ``POINT_SWAP_MIN_BYTES``); ``quick``: replay
    only the moves likely to lower the peak (``_Move.likely``), in one round, where compile
    time counts for more than the last bytes (no budget to meet)."""

    def replay(s: Schedule) -> PlannedPeak:
        return planned_peak(s, ops, storage, static, dynamic, donations)

    plan = replay(sched)
    notes: list[str] = []
    if plan.peak_bytes is None:
        return sched, plan, notes
    if moves is None:
        moves = point_swap_moves(sched, ops, storage, static, keep)
    # a swap may lower the peak only once another has (two moments live at the peak): try
    # the rest again after each round that kept one. A value idle in a body is tried only
    # while it is live at the peak (a replay of a long program costs about 0.1 s: memory-e8
    # has 12 carried values and 20 idle ones of at least 1 MiB)
    while moves:
        rest = []
        for mv in moves:
            worth = mv.likely if quick else mv.worth
            trial = mv.apply(sched) if worth(sched, plan) else None
            if trial is None:
                rest.append(mv)
                continue
            tried = replay(trial)
            if tried.peak_bytes is None or tried.peak_bytes >= (plan.peak_bytes or 0):
                rest.append(mv)
                continue
            sched, plan = trial, tried
            notes.append(f"swap: {mv.what} ({format_bytes(mv.nbytes)})")
        if quick or len(rest) == len(moves):
            break  # quick: one round (memory-e8's second rounds never lowered the peak)
        moves = rest
    return sched, plan, notes


# ---------------------------------------------------------------------- finding the state
def _is_point(op: Op, storage: Mapping[int, Storage]) -> bool:
    st = storage.get(op.id)
    return st is None or st.kind == "point"


def _picks(op: Op) -> bool:
    return prims.get(op.prim).traits.piecewise


def _carried_merges(sched: Schedule, storage: Mapping[int, Storage]) -> list[Op]:
    """Merges inside a loop whose every branch reads a value from before the body's
    iteration: an earlier point of the body's own values, or a value of an outer body."""
    out: list[Op] = []

    def visit(body: list[Stmt], inside: bool) -> None:
        here = {s.op.id for s in body if isinstance(s, Compute)}
        for s in body:
            if isinstance(s, Loop):
                visit(s.body, True)
            elif isinstance(s, Compute) and inside and _picks(s.op) and s.op.inputs:
                op = s.op
                if _is_point(op, storage) and all(
                    _is_point(e.src, storage)
                    and (e.src.id not in here or not _own_point(e.index, e.src))
                    for e in op.inputs
                ):
                    out.append(op)

    visit(sched.body, False)
    return out


def _own_point(index: tuple, op: Op) -> bool:
    """Whether ``index`` (a read's, a free's prefix) is ``op``'s own point: its domain (a
    slice, ``x[0:t]``, never is)."""
    return len(index) == len(op.domain) and all(
        not isinstance(i, Slice) and always_eq(i, d) for i, d in zip(index, op.domain, strict=True)
    )


def _after_frees(stmts: list[Stmt], k: int) -> int:
    """The first index from ``k`` on that is not a free: after a statement's frees."""
    while k < len(stmts) and isinstance(stmts[k], Free):
        k += 1
    return k


def _find(sched: Schedule, op: Op) -> tuple[_Body, int] | None:
    """The loop body computing ``op``, and its statement's index there."""

    def visit(body: list[Stmt], loops: tuple[Loop, ...]) -> tuple[_Body, int] | None:
        for k, s in enumerate(body):
            if isinstance(s, Compute) and s.op is op and loops:
                return _Body(loops), k
            if isinstance(s, Loop):
                found = visit(s.body, (*loops, s))
                if found is not None:
                    return found
        return None

    return visit(sched.body, ())


# ---------------------------------------------------------------------- carried state
def _carried_values(merge: Op, readers: Mapping[int, list[tuple[Op, Edge]]]) -> frozenset[str]:
    """The values whose bytes moving ``merge`` takes out: what it picks from (the state of the
    last update or of the outer body, whose buffer it may share), the merge, and the chain of
    sole elementwise readers after it (``beta1 * m``). A superset of the chain ``_swapped``
    moves, which also stops at a reader of another value computed in the body."""
    chain = [merge]
    while len(users := readers.get(chain[-1].id, [])) == 1:
        nxt = users[0][0]
        if not prims.get(nxt.prim).traits.elementwise or any(nxt is op for op in chain):
            break
        chain.append(nxt)
    return frozenset(op.label for op in (*chain, *(e.src for e in merge.inputs)))


def _holds(labels: frozenset[str]) -> Callable[[Schedule, PlannedPeak], bool]:
    """Whether one of ``labels`` is live at a plan's peak."""
    return lambda _sched, plan: any(name in labels for name, _ in plan.holders)


def _always(_sched: Schedule, _plan: PlannedPeak) -> bool:
    return True


def _merge_move(
    merge: Op, readers: Mapping[int, list[tuple[Op, Edge]]], storage: Mapping[int, Storage]
) -> Callable[[Schedule], Schedule | None]:
    return lambda sched: _swapped(sched, merge, readers, storage)


def _swapped(
    sched: Schedule,
    merge: Op,
    readers: Mapping[int, list[tuple[Op, Edge]]],
    storage: Mapping[int, Storage],
) -> Schedule | None:
    """``sched`` with ``merge``'s state swapped out between uses (the module's doc), or None
    where that cannot be done safely."""
    found = _find(sched, merge)
    if found is None:
        return None
    body, at = found
    stmts = body.stmts
    computed_here = {s.op.id for s in stmts if isinstance(s, Compute)}
    sources = {e.src.id for e in merge.inputs}

    # the chain: the merge, then each sole reader in this body of the chain's end that reads
    # nothing else computed here (``beta1 * m``)
    chain = [merge]
    while True:
        users = [s for s in stmts if reads(s, {chain[-1].id})]
        if len(users) != 1 or not isinstance(users[0], Compute):
            break
        nxt = users[0].op
        if not prims.get(nxt.prim).traits.elementwise or any(
            e.src.id in computed_here and e.src is not chain[-1] for e in nxt.inputs
        ):
            break
        chain.append(nxt)
    chain_ids = {op.id for op in chain}
    target = next(
        (
            k
            for k, s in enumerate(stmts)
            if k > at
            and reads(s, {chain[-1].id})
            and not (isinstance(s, Compute) and s.op.id in chain_ids)
        ),
        None,
    )
    if target is None:
        return None
    moved_ids = chain_ids | sources
    moved = [
        s
        for s in stmts[at:target]
        if (isinstance(s, Compute) and s.op.id in chain_ids)
        or (isinstance(s, Free) and s.op.id in moved_ids)
    ]
    if any(reads(s, moved_ids) for s in stmts[at:target] if not any(s is m for m in moved)):
        return None  # something between reads what moves

    swapped: dict[int, Op] = {}  # op id -> a value sent to disk
    ins: list[Stmt] = []  # read back right before the merge
    outer_edits: dict[int, tuple[list[Stmt], list[Stmt]]] = {}  # stmt id -> (before, after)
    for e in merge.inputs:
        src = e.src
        if src.id in computed_here:
            swapped[src.id] = src
        elif _picks(src) and all(r is merge for r, _ in readers.get(src.id, [])):
            outer = _find(sched, src)
            if outer is None:
                continue
            swapped[src.id] = src
            o_body, o_at = outer
            back = [
                SwapIn(b.src, tuple(b.index), points=True)
                for b in src.inputs
                if b.src.id in computed_here and b.src.id in sources
            ]
            # after the merge's frees: its branches are released before the merge goes
            k = _after_frees(o_body.stmts, o_at + 1)
            outer_edits[id(o_body.stmts[o_at])] = (back, [])
            last = o_body.stmts[k - 1]
            before, after = outer_edits.get(id(last), ([], []))
            outer_edits[id(last)] = (before, [*after, SwapOut(src, tuple(src.domain), points=True)])
        else:
            continue
        ins.append(SwapIn(src, tuple(e.index), points=True))
    if not swapped:
        return None

    new = [s for s in stmts[:target] if not any(s is m for m in moved)]
    new += ins + moved + stmts[target:]
    # the loop-carried values computed here go out after their last reader at their point
    for src in [s for i, s in swapped.items() if i in computed_here]:
        last = None
        for k, s in enumerate(new):
            if isinstance(s, Compute) and (
                s.op is src or any(e.src is src and _own_point(e.index, src) for e in s.op.inputs)
            ):
                last = k
            elif isinstance(s, Free) and s.op is src and _own_point(s.prefix, src):
                last = None  # dead at its own point: nothing carried
                break
        if last is None:
            return None
        new.insert(_after_frees(new, last + 1), SwapOut(src, tuple(src.domain), points=True))
    if not _all_reads_covered(swapped, readers, new, merge):
        return None
    return _rebuilt(sched, body.loops[-1], new, outer_edits)


def _all_reads_covered(
    swapped: Mapping[int, Op],
    readers: Mapping[int, list[tuple[Op, Edge]]],
    new: list[Stmt],
    merge: Op,
) -> bool:
    """Whether every reader of a value sent to disk is the merge or an outer merge that reads
    it back, or reads it at its own point in this body before it goes."""
    out_at = {
        s.op.id: k for k, s in enumerate(new) if isinstance(s, SwapOut) and s.op.id in swapped
    }
    for op_id in swapped:
        for reader, edge in readers.get(op_id, []):
            if reader is merge or (reader.id in swapped and _picks(reader)):
                continue
            k = next(
                (j for j, s in enumerate(new) if isinstance(s, Compute) and s.op is reader),
                None,
            )
            if k is None or op_id not in out_at or k > out_at[op_id]:
                return False
            if not _own_point(edge.index, swapped[op_id]):
                return False
    return True


# ---------------------------------------------------------------------- values idle in a body
def _idle_points(
    sched: Schedule,
    storage: Mapping[int, Storage],
    readers: Mapping[int, list[tuple[Op, Edge]]],
    keep: frozenset[int] | set[int],
) -> list[Op]:
    """Point values of a loop body read only there, at their own point, by ops that share no
    buffer with them (``Traits.shares_input``): a layer's gradient, kept for the optimiser
    while the rest of the backward pass runs."""
    out: list[Op] = []

    def inside(stmt: Stmt) -> set[int]:
        if isinstance(stmt, Loop):
            return set().union(*(inside(x) for x in stmt.body)) if stmt.body else set()
        return {stmt.op.id} if isinstance(stmt, (Compute, Start)) else set()

    def visit(body: list[Stmt], in_loop: bool) -> None:
        here = set().union(*(inside(x) for x in body)) if body else set()
        for s in body:
            if isinstance(s, Loop):
                visit(s.body, True)
                continue
            if not (in_loop and isinstance(s, Compute)):
                continue
            x = s.op
            users = readers.get(x.id, [])
            traits = prims.get(x.prim).traits
            if (
                x.id in keep
                or not users
                or not _is_point(x, storage)
                or traits.view
                or traits.piecewise
                or traits.host
            ):
                continue
            if all(
                r.id in here
                and _own_point(e.index, x)
                and not prims.get(r.prim).traits.shares_input
                for r, e in users
            ):
                out.append(x)

    visit(sched.body, False)
    return out


def _idle_at_peak(x: Op) -> Callable[[Schedule, PlannedPeak], bool]:
    """Whether the statement reaching a plan's peak runs while ``x`` is out: between the two
    uses ``_idle_swapped`` sends it out across."""

    def may_lower(sched: Schedule, plan: PlannedPeak) -> bool:
        if plan.peak_op is None or all(name != x.label for name, _ in plan.holders):
            return False
        gap = _longest_idle_gap(sched, x)
        if gap is None:
            return False
        body, (a, b) = gap
        return any(_runs(s, plan.peak_op) for s in body.stmts[a + 1 : b])

    return may_lower


def _runs(s: Stmt, op_id: int) -> bool:
    """Whether statement ``s`` computes ``op_id``, itself or in a loop it holds."""
    if isinstance(s, Loop):
        return any(_runs(t, op_id) for t in s.body)
    return isinstance(s, Compute) and s.op.id == op_id


def _longest_idle_gap(sched: Schedule, x: Op) -> tuple[_Body, tuple[int, int]] | None:
    """``x``'s body and the longest run of its statements between two uses of ``x`` there
    (the last of equals), or None where it has none or is already moved."""
    found = _find(sched, x)
    if found is None:
        return None
    body, at = found
    if any(isinstance(s, (SwapOut, SwapIn)) and s.op is x for s in body.stmts):
        return None  # already moved
    gaps = idle_gaps(body.stmts, at, x.id)
    if not gaps:
        return None
    return body, max(gaps, key=lambda g: (g[1] - g[0], g[0]))


def _idle_move(x: Op) -> Callable[[Schedule], Schedule | None]:
    return lambda sched: _idle_swapped(sched, x)


def _idle_swapped(sched: Schedule, x: Op) -> Schedule | None:
    """``sched`` with ``x`` on disk across the longest run of statements between two of its
    uses in its body (computed or read there), or None where it has no such run."""
    gap = _longest_idle_gap(sched, x)
    if gap is None:
        return None
    body, (a, b) = gap
    stmts = body.stmts
    point = tuple(x.domain)
    new = [
        *stmts[: a + 1],
        SwapOut(x, point, points=True),
        *stmts[a + 1 : b],
        SwapIn(x, point, points=True),
        *stmts[b:],
    ]
    return _rebuilt(sched, body.loops[-1], new)


def _rebuilt(
    sched: Schedule,
    loop: Loop,
    body: list[Stmt],
    edits: Mapping[int, tuple[list[Stmt], list[Stmt]]] | None = None,
) -> Schedule:
    """``sched`` with ``loop``'s body replaced by ``body`` and the statements of ``edits`` (by
    id of the statement: before it, after it) inserted."""
    edits = edits or {}

    def edit(s: Stmt, _at: Position) -> list[Stmt] | None:
        before, after = edits.get(id(s), ((), ()))
        if s is loop:
            s = replace(loop, body=body)
        elif not before and not after:
            return None
        return [*before, s, *after]

    return Schedule(rewrite(sched.body, edit))


__all__ = ["plan_point_swaps", "point_swap_moves"]
