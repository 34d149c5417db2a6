"""Blocks streamed to disk: kept in a file for good, each row written as it is computed.

A block read only by rows (``streamable``) costs no memory of its own: its rows are read back
by the chunk (``runtime/stores.py``). The chunks are memory: ``read_buffers`` gives each op
reading a streamed block by chunks the bytes it holds while it runs (two chunks where the next
is read ahead), which the replay and the run's meter count, and ``_fit_reads`` makes them
smaller where they set the peak. ``plan_streams`` tries the candidates largest first and keeps
those that lower the planned peak.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

import numpy as np

from timerl.ir import rowwise
from timerl.ir.graph import Op
from timerl.ir.prims import rows
from timerl.memory.replay import PlannedPeak, format_bytes, planned_peak, row_bytes
from timerl.memory.storage import Storage
from timerl.schedule.program import (
    Schedule,
    SwapOut,
)
from timerl.symbolic import Bound, Slice

_POINT = Storage("point", "")


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
    its rows (the row table's ``row_view``) and as the first operand of a kernel that reads
    it by chunks (``row_reader``, ``ir/prims/rows.py``)."""
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
                view_rule = rows.row_view(reader.prim)
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
            rule = rows.row_reader(reader.prim)
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
            transposed[fid] = transposed.get(src, False) ^ rows.transposes(by_id[fid].prim)
    return family, transposed


def read_buffers(
    ops: list[Op], storage: Mapping[int, Storage], static: Mapping[Bound, int]
) -> dict[int, int]:
    """Op id -> the bytes its kernel holds reading a streamed block by chunks.

    A kernel with a ``row_reader`` rule (a matmul, a ``take_matmul``) whose rows are a streamed block
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
            rule = rows.row_reader(op.prim)
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
    blocks.sort(key=lambda i: -int(table[i].extent or 0) * row_bytes(by_id[i]))
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
            size = format_bytes(int(st.extent or 0) * row_bytes(by_id[op_id]))
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
