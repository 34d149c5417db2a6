"""Memory statements from exact liveness: free every point right after its last reader.

For an op X, start at the innermost loop computing it (dim ``d``). If every reader inside that
loop reads a window at most ``k`` points behind ``d`` (``t``, ``t - 1``, ``max(t - 3, 0):t + 1``)
and every other read hits one fixed point (``x[0]``, ``x[T - 1]``, inside or after the loop),
then after each iteration's last reader the point ``d - max k`` is dead unless pinned: a
per-iteration free that makes the store a sliding window (a circular buffer of ``k + 1``
points plus the pinned ones), placed after the last reader of that oldest point (not after
the iteration's last reader: ``m[u - 1]`` dies at the one op that reads it, before the
others read ``m[u]``). Otherwise try the enclosing loop; at the top, X is freed whole after
its last reader. Where that last reader sits in a loop over a dim X lacks and every read in
it happens at the loop's first point (``w[i]`` read at ``u == 0``, an initial value read at
``i == 0``), the free moves into that loop, after the reader: it releases X in the first
iteration (later ones find nothing), instead of keeping it for the whole loop. Tensors the
user asked for are kept.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from timerl.ir.graph import Op
from timerl.schedule.program import Compute, Free, Loop, Position, Schedule, Stmt, rewrite
from timerl.symbolic import TRUE, Const, Dim, Expr, Slice, Symbol, always_eq, always_le0
from timerl.symbolic.expr import And, Cmp, Condition


def _positions(body: list[Stmt], path: tuple, out: dict[int, tuple]) -> None:
    for k, s in enumerate(body):
        if isinstance(s, Compute):
            out[s.op.id] = path + (k,)
        elif isinstance(s, Loop):
            _positions(s.body, path + (k,), out)


MAX_LAG = 64  # windows longer than this are kept whole until their loop ends


def _window(index: Expr | Slice, dim: Dim, forward: bool) -> int | None:
    """k when every point read at iteration ``d`` lies in ``[d - k, d]`` (forward loop)."""
    return window_lag(index, dim, forward, MAX_LAG)


def window_lag(index: Expr | Slice, dim: Dim, forward: bool, limit: int) -> int | None:
    """The smallest k <= ``limit`` such that every point ``index`` reads at iteration ``d``
    lies in ``[d - k, d]`` (``[d, d + k]`` in a backward loop); None if there is none."""
    lo, hi = (index.start, index.stop - 1) if isinstance(index, Slice) else (index, index)
    if dim not in lo.symbols() or dim not in hi.symbols():
        return None
    near, far = (hi - dim, dim - lo) if forward else (dim - lo, hi - dim)
    if not always_le0(near):
        return None
    if isinstance(far, Const):  # an affine offset (``t - 100``): no search
        k = max(int(far.value), 0)
        return k if k <= limit else None
    return next((k for k in range(limit + 1) if always_le0(far - k)), None)


def _pinned(index: Expr | Slice, allowed: set[Symbol]) -> Expr | None:
    """The one point a read always hits along the loop's dim (``0``, ``T - 1``), if any."""
    if isinstance(index, Slice) or not index.symbols() <= allowed:
        return None
    return index


class _Read:
    """A read that is not an edge of the graph: a view's reader reading the view's base
    (under the condition of its read of the view: ``merge(x[0:T] if u == 0, ...)``)."""

    __slots__ = ("index", "cond")

    def __init__(self, index: tuple, cond: Condition = TRUE) -> None:
        self.index = index
        self.cond = cond


def _at_first(cond: Condition, loop: Loop) -> bool:
    """Whether ``cond`` holds only at the first point ``loop`` visits (``u == 0``)."""
    d = loop.dim
    first = d - 0 if loop.forward else d - (d.bound - 1)
    parts = cond.parts if isinstance(cond, And) else (cond,)
    return any(
        isinstance(c, Cmp)
        and c.op == "=="
        and (always_eq(c.diff, first) or always_eq(c.diff, -first))
        for c in parts
    )


def add_frees(
    sched: Schedule,
    ops: Iterable[Op],
    keep: set[int],
    alias_reads: Mapping[int, list[tuple[Op, tuple, Condition]]] | None = None,
) -> Schedule:
    """Frees after each buffer's last reader; ``alias_reads`` (op id -> (reader, index, cond)) adds
    reads that reach a buffer through a view of it (see ``memory/storage.py``)."""
    ops = list(ops)
    pos: dict[int, tuple] = {}
    _positions(sched.body, (), pos)
    readers: dict[int, list] = {op.id: [] for op in ops}
    for op in ops:
        for e in op.inputs:
            readers.setdefault(e.src.id, []).append((op, e))
    for src, extra in (alias_reads or {}).items():
        readers.setdefault(src, []).extend((r, _Read(index, cond)) for r, index, cond in extra)
    inserts: dict[Position, list[Free]] = {}  # the statement they follow -> frees

    def node_at(path: tuple) -> Loop | None:
        body, node = sched.body, None
        for k in path:
            node = body[k]
            body = node.body if isinstance(node, Loop) else []
        return node if isinstance(node, Loop) else None

    def add(path: tuple, after: int, free: Free) -> None:
        path, after = _into_first_iteration(free.op, path, after, pos, readers, node_at)
        inserts.setdefault((*path, after), []).append(free)

    for op in ops:
        if op.id in keep or op.id not in pos:
            continue
        here = pos[op.id]
        reads = [(r, e) for r, e in readers.get(op.id, []) if r.id in pos]
        if not reads:
            add(here[:-1], here[-1], Free(op, tuple(op.domain)))
            continue
        depth = len(here) - 1  # here[:depth] is the path of the body holding X
        while depth > 0:
            # "partial" leaves the pinned points to an enclosing loop: keep going outward
            if _free_in_loop(op, reads, pos, here, depth, node_at, add) is True:
                break
            depth -= 1
        else:
            last = max(pos[r.id][0] for r, _ in reads)
            add((), max(last, here[0]), Free(op, ()))
    return Schedule(rewrite(sched.body, lambda s, at: [s, *inserts[at]] if at in inserts else None))


def _into_first_iteration(op: Op, path: tuple, after: int, pos, readers, node_at) -> tuple:
    """Where a free placed after statement ``after`` of body ``path`` can go instead: into
    that statement, when it is a loop over a dim ``op`` lacks, ``op`` is not computed in it,
    and every read of ``op`` inside it happens at its first point (then after the last
    statement there that holds a reader, and so on inward)."""
    while True:
        loop = node_at(path + (after,))
        if loop is None or loop.dim in op.domain:
            return path, after
        inner = path + (after,)
        if pos.get(op.id, ())[: len(inner)] == inner:
            return path, after
        inside = [
            (r, e)
            for r, e in readers.get(op.id, [])
            if r.id in pos and pos[r.id][: len(inner)] == inner
        ]
        if not inside or not all(_at_first(And.make([e.cond, r.guard]), loop) for r, e in inside):
            return path, after
        path, after = inner, max(pos[r.id][len(inner)] for r, _ in inside)


def _free_in_loop(op: Op, reads, pos, here: tuple, depth: int, node_at, add) -> bool | str:
    """Try to free X point by point inside the loop at ``here[:depth]``; False if it cannot.

    "partial" when it freed the points no one reads later but a reader in another iteration
    of an outer loop still reads a pinned point (``obs[i + 1, 0] = next_obs[i, T - 1]``): the
    pinned points are then left to an enclosing loop's free.
    """
    loop = node_at(here[:depth])
    assert loop is not None
    dim = loop.dim
    if dim not in op.domain:
        return False
    axis = op.domain.index(dim)
    outer = tuple(op.domain[:axis])
    enclosing = {node_at(here[:j]).dim for j in range(1, depth)}
    if set(outer) != enclosing:
        # The loops do not nest in the domain's order (the scheduler moved an inner dim out,
        # ``x[i, t + 1] = f(x[I - 1, t])``): a free by leading coordinates cannot name this
        # loop's points, so an enclosing loop (or the end) frees them.
        return False
    allowed: set[Symbol] = set(outer) | {d.bound for d in op.domain} | {dim.bound}
    lags: list[int] = [0]
    lag_at: list[tuple[int, int]] = []  # (lag, body position) of each window reader
    pins: list[Expr] = []
    inside_last = here[depth]
    outside_last: int | None = None
    across = False  # some reader reads another iteration of an outer loop
    for reader, edge in reads:
        path = pos[reader.id]
        index = edge.index[axis]
        if any(edge.index[k] is not outer[k] for k in range(axis)):
            # Another point of an outer dim: fine here if it is one pinned point of this dim
            # (kept by this loop's frees, released by an enclosing loop's).
            pin = _pinned(index, allowed)
            if pin is None:
                return False
            pins.append(pin)
            across = True
            continue
        if path[:depth] == here[:depth]:  # inside this loop
            k = _window(index, dim, loop.forward)
            if k is not None:
                lags.append(k)
                lag_at.append((k, path[depth]))
                inside_last = max(inside_last, path[depth])
                continue
            pin = _pinned(index, allowed)
            if pin is None:
                return False
            pins.append(pin)
            inside_last = max(inside_last, path[depth])
        elif path[: depth - 1] == here[: depth - 1]:  # after the loop, in the same body
            pin = _pinned(index, allowed)
            if pin is None:
                return False
            pins.append(pin)
            outside_last = max(outside_last or 0, path[depth - 1])
        else:
            return False
    k = max(lags)
    at = dim - k if loop.forward else dim + k
    unique_pins = tuple(dict.fromkeys(pins))
    # the oldest point (lag k) is read in this iteration only by the readers of lag k; a
    # pinned point is never freed here, and for k == 0 the point is this iteration's own
    oldest = [p for lag, p in lag_at if lag == k]
    last = max(oldest) if k > 0 and oldest else inside_last
    add(here[:depth], last, Free(op, outer + (at,), unique_pins))
    if across:
        return "partial"
    if k > 0 or unique_pins:
        after = here[depth - 1] if outside_last is None else max(outside_last, here[depth - 1])
        add(here[: depth - 1], after, Free(op, outer))
    return True
