"""Memory statements from exact liveness: free every point right after its last reader.

For an op X, find the innermost loop holding X and all its readers. If every reader reads X
there at a constant lag ``k`` behind the loop's direction (``t``, ``t - 1``, ...), the point
``t - max k`` is dead after the last reader of each iteration: a per-iteration free, which
makes the store a sliding window (a circular buffer of ``max k + 1`` points). Otherwise X is
freed as a whole after the loop (or top-level statement) holding its last reader, moving
outwards one loop at a time. Tensors the user asked for are kept.
"""

from __future__ import annotations

from collections.abc import Iterable

from timerl.ir.graph import Op
from timerl.schedule.program import Compute, Free, Loop, Schedule, Stmt
from timerl.symbolic import Dim, Expr


def _positions(body: list[Stmt], path: tuple, out: dict[int, tuple]) -> None:
    for k, s in enumerate(body):
        if isinstance(s, Compute):
            out[s.op.id] = path + (k,)
        elif isinstance(s, Loop):
            _positions(s.body, path + (k,), out)


def _lag(index: Expr, dim: Dim, forward: bool) -> int | None:
    """k if ``index`` is ``dim - k`` (forward) or ``dim + k`` (backward), k >= 0."""
    if not isinstance(index, Expr):
        return None
    diff = (dim - index) if forward else (index - dim)
    terms, const = diff.linear()
    if terms or const < 0:
        return None
    return const


def add_frees(sched: Schedule, ops: Iterable[Op], keep: set[int]) -> Schedule:
    ops = list(ops)
    pos: dict[int, tuple] = {}
    _positions(sched.body, (), pos)
    readers: dict[int, list] = {op.id: [] for op in ops}
    for op in ops:
        for e in op.inputs:
            readers.setdefault(e.src.id, []).append((op, e))
    inserts: dict[tuple, list[Free]] = {}  # (body path, index after which) -> frees

    def node_at(path: tuple) -> Loop | None:
        body, node = sched.body, None
        for k in path:
            node = body[k]
            body = node.body if isinstance(node, Loop) else []
        return node if isinstance(node, Loop) else None

    for op in ops:
        if op.id in keep or op.id not in pos:
            continue
        here = pos[op.id]
        reads = [(r, e) for r, e in readers.get(op.id, []) if r.id in pos]
        if not reads:
            inserts.setdefault((here[:-1], here[-1]), []).append(Free(op, tuple(op.domain)))
            continue
        paths = [pos[r.id] for r, _ in reads]
        common = 0
        while (
            all(len(p) > common + 1 and p[common] == here[common] for p in paths)
            and len(here) > common + 1
        ):
            common += 1
        # ``common`` leading path entries are loops shared by X and all readers.
        depth = common
        while True:
            loop = node_at(here[:depth]) if depth else None
            last = max([p[depth] for p in paths] + [here[depth]])
            if loop is None:
                inserts.setdefault((here[:depth], last), []).append(Free(op, ()))
                break
            dim = loop.dim
            axis = op.domain.index(dim)
            lags = [_lag(e.index[axis], dim, loop.forward) for _, e in reads]
            outer = tuple(op.domain[:axis])
            if all(k is not None for k in lags):
                k = max(lags)  # type: ignore[type-var]
                at = dim - k if loop.forward else dim + k
                inserts.setdefault((here[:depth], last), []).append(Free(op, outer + (at,)))
                if k > 0:
                    parent = here[: depth - 1]
                    inserts.setdefault((parent, here[depth - 1]), []).append(Free(op, outer))
                break
            # Not a fixed window: move out one loop; the whole loop is the last reader there.
            depth -= 1
            if depth < 0:
                break
    return Schedule(_rebuild(sched.body, (), inserts))


def _rebuild(body: list[Stmt], path: tuple, inserts: dict[tuple, list[Free]]) -> list[Stmt]:
    out: list[Stmt] = []
    for k, s in enumerate(body):
        if isinstance(s, Loop):
            s = Loop(s.dim, s.forward, _rebuild(s.body, path + (k,), inserts), s.until)
        out.append(s)
        out.extend(inserts.get((path, k), []))
    return out
