"""A loop-distribution scheduler over the PDG.

Why our own and not isl's: every dependence here is an affine relation on one dim at a time
(``t - k``, ``t + k``, constants, slices), so the classical algorithm is exact and small:
at each level (outermost dim first) split the ops into strongly connected components; a
component over the level's dim becomes a loop whose direction follows its carried
dependences (forward for ``t - 1``, backward for ``t + 1``); components run in dependence
order, so anything reading a whole range (``0:T``, ``t:T``, ``T - 1``) runs after its producer's
loop completes; adjacent compatible loops are fused; bodies are scheduled recursively on the
next dim with the dependences the loop does not carry. Direction facts come from the exact
sign analysis in ``symbolic.bounds``. It handles dynamic bounds (``until``) by running first,
in one forward loop, what the stop condition needs (fusing those loops into it), and
everything else over that dim, or reading its bound, after it.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import networkx as nx

from timerl.errors import BoundError, CycleError
from timerl.ir import prims
from timerl.ir.graph import Edge, Op, View, mentioned_in
from timerl.ir.shapes import static_nbytes
from timerl.schedule.pin import pin, pin_points
from timerl.schedule.program import Compute, Loop, Schedule, Stmt
from timerl.symbolic import (
    TRUE,
    Condition,
    Dim,
    Expr,
    Slice,
    Symbol,
    always_le0,
    always_lt0,
)
from timerl.symbolic.expr import And, Cmp

SAME, PAST, STRICT_PAST, FUTURE, STRICT_FUTURE, NONE = (
    "same",
    "past",
    "strict_past",
    "future",
    "strict_future",
    "none",
)


def relation(index: Expr | Slice, dim: Dim, where: Condition = TRUE) -> str:
    """How the points read along ``dim`` relate to the reader's own point on ``dim``.

    ``where``: a condition that holds wherever the read happens (the reader's guard). Its
    bounds on ``dim`` (``t >= 1``, ``t != 0``, ``t <= T - 2``) narrow the points compared, so
    ``x[t // 2]`` read only where ``t >= 1`` is strictly in the past.
    """
    if isinstance(index, Expr) and index == dim:
        return SAME
    lo, hi = (index.start, index.stop - 1) if isinstance(index, Slice) else (index, index)
    first, last = _dim_range(where, dim)
    shift: dict[Symbol, Expr] = {}
    if first or last:
        # dim in [first, D - 1 - last] is the whole range of dim' = dim - first over a bound
        # D' = D - first - last: the sign facts below hold over that canonical range.
        shift = {dim: dim + first, dim.bound: dim.bound + (first + last)}

    def at(e: Expr) -> Expr:
        return e.substitute(shift) if shift else e

    if always_lt0(at(hi - dim)):
        return STRICT_PAST
    if always_le0(at(hi - dim)):
        return PAST
    if always_lt0(at(dim - lo)):
        return STRICT_FUTURE
    if always_le0(at(dim - lo)):
        return FUTURE
    return NONE


@functools.lru_cache(maxsize=4096)
def _dim_range(where: Condition, dim: Dim) -> tuple[int, int]:
    """``(a, b)`` such that ``where`` implies ``a <= dim <= D - 1 - b`` (zeros when unsure)."""
    parts = where.parts if isinstance(where, And) else (where,)
    first = last = 0
    not_first: set[int] = set()
    not_last: set[int] = set()
    for part in parts:
        if not isinstance(part, Cmp):
            continue
        terms, c = part.diff.linear()
        if terms == {dim: -1}:  # c - dim OP 0: a lower bound
            if part.op == "!=":
                not_first.add(c)
            else:
                first = max(first, c + (part.op == "<"))
        elif terms == {dim: 1} and part.op in ("==", "!="):  # dim + c OP 0
            if part.op == "!=":
                not_first.add(-c)
            else:
                first = max(first, -c)
        elif terms == {dim: 1, dim.bound: -1}:  # dim - D + c OP 0: an upper bound
            if part.op == "!=":
                not_last.add(c - 1)
            elif part.op in ("<=", "=="):
                last = max(last, c - 1)
            elif part.op == "<":
                last = max(last, c)
        elif terms == {dim: -1, dim.bound: 1} and part.op == "!=":  # D - dim + c != 0
            not_last.add(-c - 1)
    while first in not_first:
        first += 1
    while last in not_last:
        last += 1
    return first, last


def _dep_relation(reader: Op, edge: Edge, dim: Dim) -> str:
    index = _index_on(edge, dim)
    rel = relation(index, dim)
    if rel in (SAME, STRICT_PAST, STRICT_FUTURE) or (reader.guard == TRUE and edge.cond == TRUE):
        return rel  # nothing the guard could sharpen
    return relation(index, dim, reader.guard & edge.cond)


def _index_on(edge: Edge, dim: Dim) -> Expr | Slice:
    return edge.index[edge.src.domain.index(dim)]


Dep = tuple[Op, Edge]  # (reader, edge); edge.src is the producer


@dataclass
class _Group:
    """Loop-fusion candidate: SCCs sharing one loop over ``dim``."""

    ops: list[Op] = field(default_factory=list)
    forward: bool | None = None  # None: no carried dependence yet, either direction works
    until: Op | None = None


def schedule_program(
    ops: Sequence[Op], dims: Sequence[Dim], until: Mapping[Dim, Op], fixed: set[int]
) -> tuple[list[Op], Schedule]:
    """The ops to run and their schedule: ``ops`` as given where they schedule as written,
    else with ops pinned into the recurrences they read at one fixed point
    (``timerl.schedule.pin``); when that fails too, the written program's error is raised.
    ``fixed``: ops whose domain must not change (the tensors the user asked for)."""
    ops = list(ops)
    try:
        return ops, schedule(ops, dims, until)
    except (CycleError, BoundError) as exc:
        pins = pin_points(ops, fixed, until)
        if not pins:
            raise
        pinned = pin(ops, pins, dims, fixed)
        by_id = {op.id: op for op in pinned}
        try:
            return pinned, schedule(pinned, dims, {d: by_id[op.id] for d, op in until.items()})
        except (CycleError, BoundError):
            raise exc from None


def schedule(ops: Sequence[Op], dims: Sequence[Dim], until: Mapping[Dim, Op]) -> Schedule:
    deps = [(op, e) for op in ops for e in op.inputs]
    return Schedule(_level(list(ops), deps, tuple(dims), until))


def _describe_cycle(ops: Sequence[Op]) -> str:
    return " -> ".join(op.where() for op in ops[:6]) + (" -> ..." if len(ops) > 6 else "")


def _level(ops: list[Op], deps: list[Dep], dims: tuple[Dim, ...], until) -> list[Stmt]:
    """Loops for ``ops`` over ``dims`` (the dims no enclosing loop binds, outermost first).

    The first dim some op runs over is tried first, so programs keep their written loop
    order. Where that order has no valid schedule (``x[i, t + 1] = f(x[I - 1, t])``: for each
    ``t`` all of ``x[:, t]`` is needed before any ``x[:, t + 1]``, so the loop over ``i`` must
    sit inside the loop over ``t``), the other dims are tried as the outer loop in turn; if none
    works, the error of the written order is raised. A dim ended by ``until`` moves out only
    where its stop condition does not vary over the dims it would then enclose (its length must
    be one value there).
    """
    ids = {op.id for op in ops}
    deps = [(r, e) for r, e in deps if r.id in ids and e.src.id in ids]
    candidates = [d for d in dims if any(d in op.domain for op in ops)]
    if not candidates:
        return _point_order(ops, deps)
    # a dim ended by ``until`` whose stop varies over another dim here has one length per
    # point of that dim: its loop stays where it is written, inside them
    per_point = [
        d
        for d in candidates
        if d in until and any(c in until[d].domain for c in candidates if c is not d)
    ]
    if per_point:
        candidates = candidates[:1] + [d for d in candidates[1:] if d not in per_point]
    first: CycleError | None = None
    for dim in candidates:
        rest = tuple(d for d in dims if d is not dim)
        try:
            return _loops_over(dim, ops, deps, rest, until)
        except CycleError as exc:
            first = first or exc
    assert first is not None
    if not per_point:
        out = _distribute(ops, deps, dims, until)
        if out is not None:
            return out
    raise first


def _distribute(ops: list[Op], deps: list[Dep], dims: tuple[Dim, ...], until) -> list[Stmt] | None:
    """Independent recurrences that need different loop orders, one after the other.

    ``x1`` recurring over ``i`` (``x1[i + 1, 0] = x1[i, T - 1]``) needs ``i`` outer, and ``x3``
    reading it while recurring over ``t`` across ``i`` needs ``t`` outer: no one order runs
    both, but all of ``x1`` can run before any of ``x3``. The strongly connected components are
    taken in dependence order and packed greedily into runs that schedule together (so loops
    still fuse where they can); each run completes before the next starts. None when the ops
    form one component (there is nothing to split).
    """
    graph = nx.DiGraph()
    graph.add_nodes_from(op.id for op in ops)
    graph.add_edges_from((e.src.id, r.id) for r, e in deps)
    comps = list(nx.strongly_connected_components(graph))
    if len(comps) < 2:
        return None
    cond = nx.condensation(graph, scc=comps)
    by_id = {op.id: op for op in ops}
    # what a stop condition (``until``) needs runs first: the runs after it read its dim's
    # length, which is known only once the loop that computes the stop has ended
    stops = [cond.graph["mapping"][op.id] for op in until.values() if op.id in by_id]
    first = set(stops).union(*(nx.ancestors(cond, n) for n in stops))
    order = [
        sorted((by_id[k] for k in cond.nodes[n]["members"]), key=lambda o: o.id)
        for n in nx.lexicographical_topological_sort(cond, key=lambda n: (n not in first, n))
    ]
    out: list[Stmt] = []
    run: list[Op] = []
    tried: tuple[int, list[Stmt]] = (-1, [])  # the last run that scheduled, by its length
    for comp in order:
        # An op on no cycle cannot make a run fail (errors come from cycles), so only
        # recurrences are tried against the run: a handful even in a large program.
        if not run or (len(comp) == 1 and not graph.has_edge(comp[0].id, comp[0].id)):
            run = run + comp
            continue
        trial = run + comp
        if len(trial) < len(ops):  # all of them together is what just failed
            try:
                tried = (len(trial), _level(trial, deps, dims, until))
                run = trial
                continue
            except CycleError:
                pass
        out.extend(tried[1] if tried[0] == len(run) else _level(run, deps, dims, until))
        run, tried = list(comp), (-1, [])
    if len(run) == len(ops):
        if tried[0] < 0:
            return None  # one recurrence (and ops on no cycle): nothing to split
        # the last run that scheduled (itself split further down), then the ops on no cycle
        # that came after it
        out.extend(tried[1])
        out.extend(_level(run[tried[0] :], deps, dims, until))
        return out
    out.extend(tried[1] if tried[0] == len(run) else _level(run, deps, dims, until))
    return out


def _loops_over(
    dim: Dim, ops: list[Op], deps: list[Dep], rest: tuple[Dim, ...], until
) -> list[Stmt]:
    """``ops`` as loops over ``dim`` (and statements outside them), bodies over ``rest``."""
    graph = nx.DiGraph()
    graph.add_nodes_from(op.id for op in ops)
    graph.add_edges_from((e.src.id, r.id) for r, e in deps)
    by_id = {op.id: op for op in ops}
    comps = list(nx.strongly_connected_components(graph))
    if _join_views(graph, comps, by_id, deps):
        comps = list(nx.strongly_connected_components(graph))
    sccs = [sorted((by_id[i] for i in comp), key=lambda o: o.id) for comp in comps]
    unit_of = {op.id: k for k, comp in enumerate(sccs) for op in comp}
    for comp in sccs:
        inside = [dim in op.domain for op in comp]
        if any(inside) and not all(inside):
            raise CycleError(
                f"dependence cycle mixes ops with and without dim {dim.name}: {_describe_cycle(comp)}"
            )
    carried = {
        k: _carried_direction(comp, deps, dim)
        for k, comp in enumerate(sccs)
        if dim in comp[0].domain
    }

    cond = nx.condensation(graph, scc=[{op.id for op in comp} for comp in sccs])
    # condensation renumbers: map its nodes back to our unit numbers
    unit_for_node = {n: unit_of[next(iter(cond.nodes[n]["members"]))] for n in cond.nodes}
    preds = {unit_for_node[n]: {unit_for_node[p] for p in cond.predecessors(n)} for n in cond.nodes}
    done = until.get(dim)
    done_unit = unit_of.get(done.id) if done is not None and done.id in unit_of else None
    # what the stop condition needs runs in its loop, first; what needs the bound, after it
    stop_needs, late = _after_the_stop(dim, sccs, carried, preds, done_unit)

    # the loops (``_Group``) and the runs of ops outside them (lists), in order
    items: list[_Group | list[Op]] = []
    pending_a: list[Op] = []
    group: _Group | None = None
    emitted: set[int] = set()
    remaining = set(range(len(sccs)))

    def flush_a() -> None:
        if pending_a:
            items.append(list(pending_a))
            pending_a.clear()

    def close_group() -> None:
        nonlocal group
        if group is not None:
            items.append(group)
            group = None

    while remaining:
        ready = sorted(u for u in remaining if preds[u] <= emitted)
        if done_unit is not None and done_unit not in emitted:
            ready = [u for u in ready if u == done_unit or u in stop_needs]
        loop_units = [u for u in ready if u in carried]
        a_units = [u for u in ready if u not in carried]
        waiting_for_done = group is not None and done_unit is not None and done_unit not in emitted
        choice = None
        if group is not None:
            choice = next(
                (
                    u
                    for u in loop_units
                    if _fusable(group, sccs[u], carried[u], deps, dim)
                    and not (group.until is not None and u in late)
                ),
                None,
            )
        if choice is not None:
            _add(group, sccs[choice], carried[choice], deps, dim)
        elif waiting_for_done:
            blocker = sccs[loop_units[0]] if loop_units else sccs[a_units[0]]
            raise BoundError(
                f"dim {dim.name} ends when {done.label} holds, so everything over {dim.name} "
                f"before it must run in that one forward loop, but {_describe_cycle(blocker)} cannot"
            )
        elif a_units:
            close_group()
            choice = a_units[0]
            pending_a.extend(sccs[choice])
        else:
            close_group()
            flush_a()
            choice = loop_units[0]
            group = _Group()
            _add(group, sccs[choice], carried[choice], deps, dim)
        if choice == done_unit:
            if group.forward is False:
                raise BoundError(
                    f"dim {dim.name} ends at {done.label}, so its loop must run forward"
                )
            group.until, group.forward = done, True
        emitted.add(choice)
        remaining.discard(choice)
    close_group()
    flush_a()
    if done is None:
        _sink_into_readers(items, deps, dim)
    out: list[Stmt] = []
    for item in items:
        if isinstance(item, _Group):
            out.append(_make_loop(item, deps, rest, dim, until))
        else:
            out.extend(_level(item, deps, rest, until))
    return out


def _sink_into_readers(items: list[_Group | list[Op]], deps: list[Dep], dim: Dim) -> None:
    """Move ops from a loop into the later loop that alone reads them, at the same point.

    The greedy fusion above puts an op in the first loop it can join. When a whole-range
    read (``x[0:U]``) splits the loops over ``dim`` in two, an op read only by the second
    (PPO's minibatch gather and uint8-to-float scaling, read by the update's convolution) is
    then computed for every point before any is read, and all its points are live at once:
    441 MiB of float frames for Pong's 16 minibatches of 256, where the update needs one.
    Moved into its readers' loop, one point is live at a time.

    What moves is a set closed upward inside its loop (what it reads from there moves too,
    so nothing left behind lives longer), off any recurrence, and read only by itself and the
    later loop at the same point. It moves when the bytes it holds across the loops outweigh
    those of the inputs from before whose life it extends.
    """
    where: dict[int, int] = {}
    for k, item in enumerate(items):
        for op in item.ops if isinstance(item, _Group) else item:
            where[op.id] = k
    readers: dict[int, list[Dep]] = {}
    for reader, edge in deps:
        readers.setdefault(edge.src.id, []).append((reader, edge))
    for k, item in enumerate(items):
        if not isinstance(item, _Group) or item.until is not None:
            continue
        moved = _movable(item, k, items, where, readers, dim)
        if not moved:
            continue
        ids, target = moved
        dest = items[target]
        assert isinstance(dest, _Group)
        dest.ops[:0] = [op for op in item.ops if op.id in ids]
        item.ops[:] = [op for op in item.ops if op.id not in ids]
        for i in ids:
            where[i] = target
    items[:] = [i for i in items if not isinstance(i, _Group) or i.ops]


def _movable(
    group: _Group,
    k: int,
    items: list[_Group | list[Op]],
    where: dict[int, int],
    readers: dict[int, list[Dep]],
    dim: Dim,
) -> tuple[set[int], int] | None:
    """The ops of ``group`` (item ``k``) to move, and the item they move to; None if none."""
    own = {op.id for op in group.ops}
    inner = nx.DiGraph()
    inner.add_nodes_from(own)
    inner.add_edges_from(
        (e.src.id, op.id) for op in group.ops for e in op.inputs if e.src.id in own
    )
    on_cycle = {i for c in nx.strongly_connected_components(inner) if len(c) > 1 for i in c}
    on_cycle |= {u for u, v in inner.edges if u == v}

    def later_loop(op_id: int, inside: set[int]) -> int | None | bool:
        """The one later loop reading ``op_id`` at its own point (besides ``inside``);
        None if only ``inside`` reads it, False if it cannot move."""
        targets = set()
        for reader, edge in readers.get(op_id, []):
            if reader.id in inside:
                if _dep_relation(reader, edge, dim) != SAME:
                    return False
                continue
            t = where.get(reader.id)
            dest = items[t] if t is not None else None
            if (
                t is None
                or t <= k
                or not isinstance(dest, _Group)
                or dest.until is not None
                or _dep_relation(reader, edge, dim) != SAME
            ):
                return False
            targets.add(t)
        if len(targets) > 1:
            return False
        return next(iter(targets), None)

    # grow from the ops read only by a later loop, then drop what leaves an input behind
    moving: set[int] = set()
    changed = True
    while changed:
        changed = False
        for op in group.ops:
            if op.id in moving or op.id in on_cycle or not readers.get(op.id):
                continue
            if later_loop(op.id, moving) is not False:
                moving.add(op.id)
                changed = True
    changed = True
    while changed and moving:
        changed = False
        for op in group.ops:
            if op.id not in moving:
                continue
            left = any(e.src.id in own and e.src.id not in moving for e in op.inputs)
            if left or later_loop(op.id, moving) is False:
                moving.discard(op.id)
                changed = True
    targets = {later_loop(i, moving) for i in moving} - {None}
    if not moving or len(targets) != 1:
        return None
    target = targets.pop()
    assert isinstance(target, int)
    by_id = {op.id: op for op in group.ops}
    held = [
        static_nbytes(by_id[i].shape, by_id[i].dtype)
        for i in moving
        if any(where.get(r.id) == target for r, _ in readers[i])
    ]
    # bytes per point of ``dim`` held longer: an input over ``dim`` is held point for point
    # like what moves; a whole input once, against the at least two points that move
    extended: list[int | None] = []
    for i in moving:
        for e in by_id[i].inputs:
            src = e.src
            if src.id in moving or any(
                where.get(r.id, -1) > k and r.id not in moving for r, _ in readers.get(src.id, [])
            ):
                continue  # moves too, or is read after this loop anyway
            size = static_nbytes(src.shape, src.dtype)
            extended.append(size if size is None or dim in src.domain else size // 2)
    if None in held or None in extended:
        return None
    if sum(held) <= sum(extended):  # type: ignore[arg-type]
        return None
    return moving, target


def _join_views(
    graph: nx.DiGraph, comps: list[set[int]], by_id: dict[int, Op], deps: list[Dep]
) -> bool:
    """A view on its own (incrementalisation's ``narrow`` of a block of rows) joins the one
    component that reads it, where its readers share its domain and read it at their own
    point: run in a loop of its own, each of its points would be held from that loop to
    its readers' (for a block read, every block of every update step). The back edges
    added make them one component; the dependences the loops are built from do not change.
    True when an edge was added (the components are then to be found again)."""
    comp_of = {i: n for n, comp in enumerate(comps) for i in comp}
    reads: dict[int, list[Dep]] = {}
    for reader, edge in deps:
        reads.setdefault(edge.src.id, []).append((reader, edge))
    joined = False
    for i, op in by_id.items():
        if len(comps[comp_of[i]]) != 1 or not prims.get(op.prim).traits.view:
            continue
        rs = reads.get(i, [])
        if (
            rs
            and len({comp_of[r.id] for r, _ in rs}) == 1
            and all(r.domain == op.domain and View(op, e.index).is_identity for r, e in rs)
        ):
            graph.add_edge(rs[0][0].id, i)
            joined = True
    return joined


def _carried_direction(comp: list[Op], deps: list[Dep], dim: Dim) -> bool | None:
    """True: forward, False: backward, None: no carried dependence inside this SCC."""
    ids = {op.id for op in comp}
    forward = backward = False
    for reader, edge in deps:
        if reader.id not in ids or edge.src.id not in ids:
            continue
        rel = _dep_relation(reader, edge, dim)
        if rel == NONE:
            raise CycleError(
                f"{reader.where()} reads {edge.src.label}[{_index_on(edge, dim)}] inside a "
                f"recurrence over {dim.name}: that index is neither before nor after {dim.name} "
                "at every point, so no loop direction can run it"
            )
        forward |= rel in (PAST, STRICT_PAST)
        backward |= rel in (FUTURE, STRICT_FUTURE)
    if forward and backward:
        raise CycleError(
            f"recurrence over {dim.name} reads both earlier and later points: {_describe_cycle(comp)}"
        )
    return True if forward else (False if backward else None)


def _fusable(
    group: _Group, comp: list[Op], direction: bool | None, deps: list[Dep], dim: Dim
) -> bool:
    if group.forward is not None and direction is not None and group.forward != direction:
        return False
    want = group.forward if group.forward is not None else direction
    ids = {op.id for op in comp}
    gids = {op.id for op in group.ops}
    for reader, edge in deps:
        if reader.id in ids and edge.src.id in gids:
            rel = _dep_relation(reader, edge, dim)
            if rel == SAME:
                continue
            if rel in (PAST, STRICT_PAST) and want in (True, None):
                want = True
                continue
            if rel in (FUTURE, STRICT_FUTURE) and want in (False, None):
                want = False
                continue
            return False
    return True


def _add(group: _Group, comp: list[Op], direction: bool | None, deps: list[Dep], dim: Dim) -> None:
    ids = {op.id for op in comp}
    gids = {op.id for op in group.ops}
    if direction is not None:
        group.forward = direction
    for reader, edge in deps:
        if reader.id in ids and edge.src.id in gids:
            rel = _dep_relation(reader, edge, dim)
            if rel in (PAST, STRICT_PAST):
                group.forward = True
            elif rel in (FUTURE, STRICT_FUTURE):
                group.forward = False
    group.ops.extend(comp)


def _after_the_stop(
    dim: Dim,
    sccs: list[list[Op]],
    carried: Mapping[int, object],
    preds: dict[int, set[int]],
    done_unit: int | None,
) -> tuple[set[int], set[int]]:
    """The units the stop condition of ``dim`` needs, and the units over ``dim`` that must
    run in a loop after the stopping one; every unit that needs the bound and not the stop
    is ordered after the stop (in ``preds``).

    ``dim``'s bound is known once the loop that ends it (``ctx.until``) has run. Until then
    only what the stop condition needs may run, in that one forward loop: a backward
    recurrence that does not feed it waits for the bound rather than being fused in front
    (which would make the stopping loop run backward). While it runs, the loop's guards see
    the cap as the bound (``runtime/executor``): right for what the stop needs (a step
    computed at every point, as far as the loop goes), wrong for an op guarded to the last
    point (``x[t.eq(T - 1)] = ...``), which joins no stopping loop. An op outside that loop
    reads the bound through its shape, a per-point attribute (a mean's count is a ``full``
    of the bound) or an index (``x[T - 1]``), often with no edge from the loop that would
    order it after; placed before, it would read a bound nobody set. One the stop condition
    itself needs can never run: an error naming it.
    """
    if done_unit is None:
        return set(), set()
    bound = dim.bound
    needed_by_stop: set[int] = set()
    stack = [done_unit]
    while stack:
        for p in preds[stack.pop()]:
            if p not in needed_by_stop:
                needed_by_stop.add(p)
                stack.append(p)
    late: set[int] = set()
    for k, comp in enumerate(sccs):
        if k == done_unit or (k in carried and k in needed_by_stop):
            continue
        if k in carried:
            if any(_reads_bound(op, bound) or _guard_reads_bound(op, bound) for op in comp):
                late.add(k)
                preds[k].add(done_unit)
            continue
        if not any(_reads_bound(op, bound) for op in comp):
            continue
        if k in needed_by_stop:
            raise BoundError(
                f"dim {dim.name} ends when {sccs[done_unit][0].label} holds, which needs "
                f"{comp[0].label}, which needs {bound.name}: known only once {dim.name} has ended"
            )
        preds[k].add(done_unit)
    return needed_by_stop, late


def _guard_reads_bound(op: Op, bound: Symbol) -> bool:
    """Whether ``op``'s guard or the conditions of its reads mention ``bound``."""
    return bound in op.guard.symbols() or any(bound in e.cond.symbols() for e in op.inputs)


def _reads_bound(op: Op, bound: Symbol) -> bool:
    """Whether ``op`` needs ``bound``'s value: in its shape, an attribute evaluated per point
    or an index it reads at."""
    items: list[object] = [*op.shape]
    items += [op.attrs[a] for a in prims.get(op.prim).point_attrs if a in op.attrs]
    for e in op.inputs:
        items += e.index
    return mentioned_in(items, bound)


def _make_loop(group: _Group, deps: list[Dep], rest: tuple[Dim, ...], dim: Dim, until) -> Loop:
    forward = group.forward if group.forward is not None else True
    strict = STRICT_PAST if forward else STRICT_FUTURE
    ids = {op.id for op in group.ops}
    body_deps = [
        (r, e)
        for r, e in deps
        if r.id in ids and e.src.id in ids and _dep_relation(r, e, dim) != strict
    ]
    body = _level(group.ops, body_deps, rest, until)
    return Loop(dim, forward, body, group.until)


def _point_order(ops: list[Op], deps: list[Dep]) -> list[Stmt]:
    graph = nx.DiGraph()
    graph.add_nodes_from(op.id for op in ops)
    graph.add_edges_from((e.src.id, r.id) for r, e in deps)
    by_id = {op.id: op for op in ops}
    try:
        order = list(nx.lexicographical_topological_sort(graph))
    except nx.NetworkXUnfeasible:
        cycle = [by_id[u] for u, _ in nx.find_cycle(graph)]
        raise CycleError(
            "dependence cycle with no base case (each value needs itself at the same point): "
            + _describe_cycle(cycle)
        ) from None
    return [Compute(by_id[i]) for i in order]
