"""Storage analysis: how each op's points are held at run time, as a side table op id -> Storage.

* **block**: a tensor written point by point along its last dim ``d`` (the innermost loop that
  computes it), with a static extent, freed only as whole blocks (never point by point) and read
  as a slice along ``d``. One array of ``extent`` rows is allocated when the loop over ``d``
  starts (one per point of the outer dims); each point is written in place into its row and a
  slice read ``x[a:b]`` is a view of the block, not a stacked copy. Where the op's kernel can
  write into a buffer it is given (``donation.computes_into``: elementwise, its inputs of its
  dtype), it writes the row itself (``in_place``): no result array is made and copied in (a
  rollout step's activations: +1-9% env steps/s on torch, -1% to +4% on numpy, PPO benchmarks).
* **alias**: ``identity``/``detach``/``reshape`` of a block (or alias) at the same point, in
  the same loop: a block store whose rows are the base block's memory reshaped; computing it
  writes nothing. Liveness keeps the base block alive until the alias's last reader.
* **view**: ``identity``/``detach``/``reshape`` of a whole block (``x[i, 0:T]``), or of such a
  view at the same point. Its value aliases the block: it allocates nothing, and the block is
  freed only after the view's last reader (liveness is told so through ``alias_reads``).
* **ring** (a circular buffer): a tensor written point by point along its last dim ``d``
  and read only inside that loop, at the same outer point, within a bounded window behind the
  loop (``x[t - 1]``, ``x[max(t - 3, 0):t + 1]``, ``x[t + 1]`` in a backward loop), by ops that
  return fresh arrays. It keeps ``k + 1`` rows for a window of lag ``k``: point ``t`` lives in
  row ``t mod (k + 1)``, written in place; a window slice is a view when its rows do not wrap,
  else a gather of the rows in order. Unlike a block it needs no static extent and no
  whole-block reader, and unlike a point store it holds ``k + 1`` rows even where liveness
  cannot free point by point (a lag over ``liveness.MAX_LAG``).
* **point**: everything else, a dict from point to value.

The table is decided on a schedule that already has its memory statements (a block needs
whole-block frees); ``alias_reads`` lets liveness run again so that a block outlives its views.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from timerl.ir import prims
from timerl.ir.graph import Op, View
from timerl.memory.donation import computes_into
from timerl.memory.liveness import add_frees, window_lag
from timerl.schedule.program import Compute, Free, Loop, Position, Schedule, Stmt, rewrite
from timerl.symbolic import TRUE, Bound, Const, Dim, Slice, always_eq
from timerl.symbolic.expr import Condition


def _whole_view(op: Op) -> str | None:
    """``"contiguous"``/``"strided"`` for a view of its whole input (``Traits.whole_view``)."""
    return prims.get(op.prim).traits.whole_view


@dataclass(frozen=True)
class Storage:
    kind: str  # "point" | "block" | "ring" | "alias" | "view"
    why: str
    dim: Dim | None = None  # block, ring: the dim it runs along (the op's last dim)
    extent: int | None = None  # block, ring: rows allocated
    base: int | None = None  # view, alias: the block op whose memory it is
    contiguous: bool = True  # view: False after a permute or expand (a reshape may copy)
    # block: kept in a file under a memory budget, read back by rows (memory/budget.py),
    # by chunks of ``chunk_bytes`` (0: ``ir/rowwise.CHUNK_BYTES``), the next one read ahead
    streamed: bool = False
    chunk_bytes: int = 0
    read_ahead: bool = False
    # any op: bytes of a streamed block's rows its kernel holds while it runs (the chunks)
    read_bytes: int = 0
    # block, ring: its kernel writes each point straight into its row (``out=``), where a
    # result array would be made and copied in (``donation.computes_into``; the backend must
    # have a lowering that writes into a buffer, and a streamed block does not)
    in_place: bool = False


def _loops_around(body: list[Stmt], out: dict[int, tuple[Loop, ...]], path: tuple = ()) -> None:
    for s in body:
        if isinstance(s, Compute):
            out.setdefault(s.op.id, path)
        elif isinstance(s, Loop):
            _loops_around(s.body, out, path + (s,))


def analyse(
    sched: Schedule, ops: Iterable[Op], static: Mapping[Bound, int], keep: set[int]
) -> dict[int, Storage]:
    """The storage of every op computed by ``sched``."""
    ops = list(ops)
    around: dict[int, tuple[Loop, ...]] = {}
    _loops_around(sched.body, around)
    frees: dict[int, list[Free]] = {}
    for s in sched.statements():
        if isinstance(s, Free):
            frees.setdefault(s.op.id, []).append(s)
    readers: dict[int, list] = {op.id: [] for op in ops}
    for op in ops:
        for e in op.inputs:
            readers.setdefault(e.src.id, []).append((op, e))
    table: dict[int, Storage] = {}
    for op in ops:
        if op.id in around:
            table[op.id] = _block_or_point(op, around[op.id], frees, readers, static, keep, around)
    by_id = {op.id: op for op in ops}
    # row aliases: a view op at the same point of a block is the block's memory, reshaped
    changed = True
    while changed:
        changed = False
        for op in ops:
            if table.get(op.id, _POINT).kind != "alias" and _is_alias(op, table, around, keep):
                src = table[op.inputs[0].src.id]
                root = src.base if src.kind == "alias" else op.inputs[0].src.id
                table[op.id] = Storage(
                    "alias",
                    f"a view of {by_id[root].label} at each point: its rows are that block's "
                    "memory, nothing is allocated or copied",
                    dim=src.dim,
                    extent=src.extent,
                    base=root,
                )
                changed = True
    # views of whole blocks (a view of a view has the same base block), until none changes:
    # a block that turns out to be a view itself (a gathered block of rows, read whole along
    # an outer dim) no longer has views of its own
    before = dict(table)
    for _ in range(len(ops) + 1):
        changed = False
        for op in ops:
            found = _view_base(op, table, keep)
            if found is None:
                now = before.get(op.id)
            else:
                base, contiguous = found
                now = Storage(
                    "view",
                    f"a view of block {by_id[base].label}: allocates nothing",
                    base=base,
                    contiguous=contiguous,
                )
            if now is not None and table.get(op.id) != now:
                table[op.id] = now
                changed = True
        if not changed:
            break
    # views of a point at that same point (the transpose of an activation for its weight
    # gradient): the point's memory, so they hold nothing of their own; liveness keeps the
    # point alive until the view's last reader (``alias_reads``)
    for op in ops:
        if table.get(op.id, _POINT).kind == "point":
            base = _point_view_base(op, table, keep)
            if base is not None:
                table[op.id] = Storage(
                    "view",
                    f"a view of {by_id[base].label} at each point: allocates nothing",
                    base=base,
                    contiguous=_whole_view(op) == "contiguous",
                )
    for i, st in table.items():  # a view of such a view is a view of the same point
        root = st.base
        while st.kind == "view" and root is not None and table[root].kind == "view":
            root = table[root].base
        if root != st.base:
            table[i] = dataclasses.replace(st, base=root, contiguous=False)
    return table


def _point_view_base(op: Op, table: Mapping[int, Storage], keep: set[int]) -> int | None:
    """The point-stored op whose value ``op`` is always a view of, read at its own point:
    a permute or broadcast (always views), or an identity, detach or reshape of an op whose
    kernel makes a fresh array (a reshape of a strided array would copy it)."""
    kind = _whole_view(op)
    if kind is None or op.id in keep or len(op.inputs) != 1:
        return None
    e = op.inputs[0]
    src = table.get(e.src.id)
    if src is None or src.kind != "point" or e.cond != TRUE or e.src.domain != op.domain:
        return None
    if not View(e.src, e.index).is_identity:
        return None
    traits = prims.get(e.src.prim).traits
    if traits.host or traits.multi_output or (kind == "contiguous" and not traits.fresh):
        return None
    return e.src.id


def _block_or_point(op, loops, frees, readers, static, keep, around) -> Storage:
    traits = prims.get(op.prim).traits
    if op.id in keep:
        return Storage("point", "kept after the run (an output)")
    if traits.host:
        return Storage("point", "a host call's value")
    if traits.multi_output:
        return Storage("point", "a tuple of values")
    if not op.domain:
        return Storage("point", "a single point")
    if not all(isinstance(s, Const) for s in op.shape):
        return Storage("point", "its shape is not static (it depends on a bound or the point)")
    if tuple(loop.dim for loop in loops) != tuple(op.domain):
        return Storage("point", "not computed in one loop per dim of its domain")
    loop = loops[-1]
    dim = loop.dim
    ring = _ring(op, loop, frees, readers, around, static)
    if ring is not None:
        return ring
    if loop.until is not None or dim.bound not in static:
        return Storage("point", f"the extent of {dim.name} is known only while it runs")
    sliced = [
        r
        for r, e in readers.get(op.id, [])
        if isinstance(e.index[-1], Slice) and not any(isinstance(i, Slice) for i in e.index[:-1])
    ]
    if not sliced:
        return Storage("point", f"no reader reads it as a slice along {dim.name}")
    fs = frees.get(op.id, [])
    if any(len(f.prefix) >= len(op.domain) or f.pinned for f in fs):
        return Storage("point", f"freed point by point along {dim.name} (a window)")
    extent = int(static[dim.bound])
    in_place = computes_into(op)
    return Storage(
        "block",
        f"written along {dim.name}, read as a slice by {sliced[0].label}: "
        f"{extent} rows allocated when the loop over {dim.name} starts, slices are views"
        + (_IN_PLACE if in_place else ""),
        dim=dim,
        extent=extent,
        in_place=in_place,
    )


_IN_PLACE = "; its kernel writes each row in place"


_POINT = Storage("point", "")
MAX_RING_LAG = 4096  # a longer window is not worth a search: the tensor stays a point store


def _ring(op, loop, frees, readers, around, static) -> Storage | None:
    """A circular buffer of ``k + 1`` rows when every read is a window of lag at most ``k``
    behind ``loop`` (see the module docstring), else None."""
    dim = loop.dim
    reads = readers.get(op.id, [])
    if not reads or any(f.pinned for f in frees.get(op.id, [])):
        return None
    outer = op.domain[:-1]
    lag = 0
    for r, e in reads:
        traits = prims.get(r.prim).traits
        # the reader's value must not alias a row: the row is overwritten k + 1 points later
        if traits.host or not (traits.fresh or traits.reduction):
            return None
        if not any(x is loop for x in around.get(r.id, ())):
            return None
        if not all(i is d for i, d in zip(e.index[:-1], outer, strict=True)):
            return None
        k = window_lag(e.index[-1], dim, loop.forward, MAX_RING_LAG)
        if k is None:
            return None
        lag = max(lag, k)
    rows = lag + 1
    if lag == 0 or (dim.bound in static and rows >= int(static[dim.bound])):
        return None
    in_place = computes_into(op)
    return Storage(
        "ring",
        f"read only in a window of {rows} points along {dim.name}: circular, {rows} rows "
        f"(point {dim.name} in row {dim.name} mod {rows})" + (_IN_PLACE if in_place else ""),
        dim=dim,
        extent=rows,
        in_place=in_place,
    )


def _is_alias(op: Op, table: Mapping[int, Storage], around: Mapping, keep: set[int]) -> bool:
    if _whole_view(op) != "contiguous" or op.id in keep or len(op.inputs) != 1:
        return False
    if op.guard != TRUE:
        return False
    e = op.inputs[0]
    src = table.get(e.src.id)
    if src is None or src.kind not in ("block", "alias") or e.cond != TRUE:
        return False
    if tuple(op.domain) != tuple(e.src.domain) or op.dtype != e.src.dtype:
        return False
    if not all(i is d for i, d in zip(e.index, op.domain, strict=True)):
        return False
    if not all(isinstance(x, Const) for x in op.shape):
        return False
    loops, src_loops = around.get(op.id), around.get(e.src.id)
    return bool(loops) and bool(src_loops) and loops[-1] is src_loops[-1]


def _view_base(op: Op, table: Mapping[int, Storage], keep: set[int]) -> tuple[int, bool] | None:
    """The block op whose memory ``op``'s value aliases (and whether the view is contiguous),
    if it only aliases one."""
    kind = _whole_view(op)
    strided = kind == "strided"
    if kind is None and prims.get(op.prim).traits.view:
        return _part_view_base(op, table, keep)
    if kind is None or op.id in keep or len(op.inputs) != 1:
        return None
    if op.id not in table:
        return None
    # a guard is fine: where it fails the view is not taken, and nothing reads it there
    e = op.inputs[0]
    src = table.get(e.src.id)
    if (
        src is None
        or src.kind == "point"
        or e.cond != TRUE
        or src.base is None
        and src.kind != "block"
    ):
        return None
    if src.kind == "view":  # the same point of a view: a view of the same block
        same_point = tuple(op.domain) == tuple(e.src.domain) and all(
            i is d for i, d in zip(e.index, op.domain, strict=True)
        )
        if not same_point or (prims.get(op.prim).traits.reshapes and not src.contiguous):
            return None
        assert src.base is not None
        return src.base, src.contiguous and not strided
    # the whole block at this point: x[outer..., 0:T]
    outer, last = e.index[:-1], e.index[-1]
    if tuple(op.domain) != tuple(e.src.domain[:-1]):
        return None
    if not all(i is d for i, d in zip(outer, op.domain, strict=True)):
        return None
    if not isinstance(last, Slice) or src.dim is None:
        return None
    if not (always_eq(last.start, Const(0)) and always_eq(last.stop, src.dim.bound)):
        return None
    base = src.base if src.kind == "alias" else e.src.id
    assert base is not None
    return base, not strided


def _part_view_base(
    op: Op, table: Mapping[int, Storage], keep: set[int]
) -> tuple[int, bool] | None:
    """A view of part of a whole-block view (``narrow``: a block of rows the update reads,
    ``compiler/incrementalize.py``) read at the view's own point, at any point of the dims
    the part view adds: the same block's memory. Not known to be contiguous."""
    if op.id in keep or len(op.inputs) != 1 or op.id not in table:
        return None
    e = op.inputs[0]
    src = table.get(e.src.id)
    if src is None or src.kind != "view" or e.cond != TRUE or src.base is None:
        return None
    if not View(e.src, e.index).is_identity:
        return None
    return src.base, False


def alias_reads(
    ops: Iterable[Op], table: Mapping[int, Storage]
) -> dict[int, list[tuple[Op, tuple, Condition]]]:
    """For each block with views: every read of a view, as a read of the whole block, under
    the read's condition.

    Liveness adds these to the block's readers, so the block is freed after its views' last
    reader (a view keeps its base alive); a block read through a view only at a loop's
    first point (an update reading the rollout's rows at ``u == 0``) is freed there.
    """
    out: dict[int, list[tuple[Op, tuple, Condition]]] = {}
    for op in ops:
        for e in op.inputs:
            st = table.get(e.src.id)
            if st is None or st.kind not in ("view", "alias") or st.base is None:
                continue
            if st.kind == "alias" or table[st.base].kind == "point":  # the same point
                out.setdefault(st.base, []).append((op, tuple(e.index), e.cond))
                continue
            dim = table[st.base].dim
            assert dim is not None
            whole = Slice(Const(0), dim.bound)
            out.setdefault(st.base, []).append((op, tuple(e.index) + (whole,), e.cond))
    return out


def plan_storage(
    scheduled: Schedule,
    planned: Schedule,
    ops: list[Op],
    static: Mapping[Bound, int],
    keep: set[int],
) -> tuple[Schedule, dict[int, Storage]]:
    """The storage table, and the memory statements again if views must keep blocks alive.

    ``scheduled`` is the schedule before memory statements, ``planned`` after. When a block
    stops qualifying once its views' readers extend its life (it would be freed point by
    point), its views are stored as points instead and the first plan is kept.
    """
    table = analyse(planned, ops, static, keep)
    extra = alias_reads(ops, table)
    if not extra:
        return free_aliases_with_base(planned, ops, table), table
    again = add_frees(scheduled, ops, keep, extra)
    second = analyse(again, ops, static, keep)
    if all(second.get(i) == s for i, s in table.items()):
        return free_aliases_with_base(again, ops, second), second
    for i, s in list(table.items()):
        if s.kind in ("view", "alias"):
            table[i] = Storage("point", "a view whose block cannot outlive it")
    return planned, table


def free_aliases_with_base(
    sched: Schedule, ops: Iterable[Op], table: Mapping[int, Storage]
) -> Schedule:
    """An alias's blocks are freed where its base's are, not where its own points die.

    An alias's rows are its base block reshaped, so its store holds a reference to that
    block; liveness frees the alias point by point (it was planned as a point store), and a
    point free releases no block. Without a whole-block free the alias would keep every
    iteration's base block alive. The base outlives every reader of its aliases
    (``alias_reads``), so its frees are the alias's too."""
    aliases: dict[int, list[Op]] = {}
    for op in ops:
        st = table.get(op.id)
        if st is not None and st.kind == "alias" and st.base is not None:
            aliases.setdefault(st.base, []).append(op)
    if not aliases:
        return sched
    moved = {op.id for group in aliases.values() for op in group}

    def edit(s: Stmt, _at: Position) -> list[Stmt] | None:
        if not isinstance(s, Free):
            return None
        if s.op.id in moved:
            return []
        return [s, *(Free(a, s.prefix, s.pinned) for a in aliases.get(s.op.id, ()))]

    return Schedule(rewrite(sched.body, edit))
