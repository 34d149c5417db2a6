"""Products: ``matmul`` (numpy's batched matrix product) and ``take_matmul`` (the product of
gathered rows, walked a chunk at a time so that the gathered rows are never built)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

import timerl.ir.prims.cost as cost
from timerl.errors import ShapeError
from timerl.ir import rowwise
from timerl.ir.graph import Op
from timerl.ir.prims.batching import Batch, Batched, Batching, Decline, point_rank
from timerl.ir.prims.core import Shape, Traits, swap_last, unbroadcast
from timerl.ir.prims.define import define
from timerl.ir.prims.rows import Decline as RowDecline
from timerl.ir.prims.rows import Numbered, RowReader, Rows, const_size
from timerl.ir.prims.simplify import Lookup, is_identity
from timerl.ir.shapes import broadcast, promote
from timerl.symbolic import TRUE, Bound, Const, Expr, Slice


def _infer_matmul(shapes, dtypes, attrs):
    a, b = shapes
    if len(a) < 2 or len(b) < 2:
        raise ShapeError(f"matmul needs operands of rank >= 2, got {a} and {b}")
    if a[-1] != b[-2]:
        raise ShapeError(f"matmul: inner sizes differ: {tuple(a)} @ {tuple(b)}")
    batch = broadcast(a[:-2], b[:-2], what="matmul batch dims")
    return batch + (a[-2], b[-1]), promote(*dtypes)


def _vjp_matmul(ap, op, i, o, g):
    a, b = i
    ga = ap("matmul", g, swap_last(ap, b))
    gb = ap("matmul", swap_last(ap, a), g)
    return [unbroadcast(ap, ga, a.shape), unbroadcast(ap, gb, b.shape)]


def _batch_matmul(b: Batch) -> Batched:
    # point by point both operands have rank >= 2 (the primitive requires it), so with the
    # batched ones padded to the result's rank, numpy/torch batch broadcasting puts the batch
    # axis first and leaves the per-point product unchanged
    if any(len(s) < 2 for s in b.shapes):
        raise Decline("matmul of a vector: broadcasting would not keep the batch axis first")
    return Batched("matmul", dict(b.op.attrs), operand_rank=point_rank(b))


def _matmul_blocks(op, axis: int, out: Shape, shapes: Sequence[Shape]) -> tuple[int | None, ...]:
    a, b = shapes
    if len(b) == 2 and len(a) >= 2 and axis <= len(a) - 2:
        return (axis, None)  # rows of the left operand, times a matrix
    if len(a) == 2 and len(b) == 2 and axis == 1:
        return (None, 1)
    raise RowDecline("a batched product over its rows, or a vector product")


def _contract_rows(op, shapes: Sequence[Shape]) -> dict[int, tuple[int | None, ...]]:
    """``x.T @ g`` over all rows is the sum of its products over blocks of rows."""
    a, b = shapes
    n = const_size(b[0]) if len(b) == 2 else None
    if len(a) != 2 or n is None or const_size(a[1]) != n:
        return {}
    return {n: (1, 0)}


def _matmul_key(op, vals: list[Numbered]) -> tuple | None:
    """Rows times a matrix: each row's product is its own."""
    a, b = vals
    if not a.row or b.row or a.rank != 2 or b.rank != 2:
        return None
    return (op.prim, ())


def _matmul_declines(reader: Op, transposed: bool, source: Op) -> str | None:
    if len(reader.inputs[1].src.shape) != 2:
        return f"{reader.label} multiplies it by a batch of matrices"
    if transposed and len(source.shape) != 2:
        return f"{reader.label} multiplies its transpose as a batch"
    return None


def _every_row(reader: Op, env: Mapping[Bound, int], nrows: int) -> int:
    return nrows


def _point_read(edge) -> bool:
    """The edge reads one point (no slice): its value has its source's shape."""
    return edge.cond == TRUE and not any(isinstance(i, Slice) for i in edge.index)


def matmul_of_gather(op: Op, lookup: Lookup) -> Op | None:
    """``take(x, idx) @ w`` is ``take_matmul(x, idx, w)`` and ``take(x, idx).T @ g`` is
    ``take_matmul(x, idx, g, trans=True)`` (a weight's gradient), also with the gathered rows
    flattened by a reshape in between: the product walks the rows in chunks, so the
    gathered minibatch is never built.

    Only for a gather larger than one chunk: below that, the gather is built once and shared
    by every product reading it (PPO's actor, critic and their weight gradients), where each
    take_matmul would gather its rows again."""
    if len(op.inputs) != 2 or not is_identity(op.inputs[0]) or op.inputs[1].cond != TRUE:
        return None
    a = lookup(op.inputs[0].src)
    trans = False
    if a.prim == "permute" and tuple(a.attrs.get("perm", ())) == (1, 0):
        if not is_identity(a.inputs[0]):
            return None
        a, trans = lookup(a.inputs[0].src), True
    if a.prim == "reshape" and len(a.shape) == 2 and is_identity(a.inputs[0]):
        # the gathered rows flattened (a policy's input layer): take_matmul flattens rows
        inner = lookup(a.inputs[0].src)
        if inner.prim != "take" or not inner.shape or inner.shape[0] != a.shape[0]:
            return None
        a = inner
    if a.prim != "take" or len(op.shape) != 2 or a.attrs.get("axis", 0) != 0:
        return None
    if not all(isinstance(s, Const) for s in a.shape):
        return None
    gathered = int(np.prod([s.value for s in a.shape], dtype=np.int64)) * a.dtype.itemsize
    if gathered <= rowwise.CHUNK_BYTES:
        return None
    x_edge, idx_edge = a.inputs
    if not (_point_read(x_edge) and _point_read(idx_edge)):
        return None
    x, idx = lookup(x_edge.src), lookup(idx_edge.src)
    if len(x.shape) < 2 or len(idx.shape) != 1:
        return None
    if x.dtype != op.dtype:
        return None
    return Op(
        prim="take_matmul",
        domain=op.domain,
        shape=op.shape,
        dtype=op.dtype,
        inputs=[x_edge, idx_edge, op.inputs[1]],
        attrs={"trans": trans},
        name=op.name,
        site=op.site,
    )


define(
    "matmul",
    _infer_matmul,
    rowwise.rows_matmul,
    _vjp_matmul,
    traits=Traits(fresh=True),
    cost=cost.product,
    batching=Batching(_batch_matmul),
    rows=Rows(
        blocks=_matmul_blocks,
        accumulates=_contract_rows,
        stacks=_matmul_key,
        row_reader=RowReader(_matmul_declines, lambda _r, transposed: transposed, _every_row),
    ),
    simplify=(matmul_of_gather,),
)


def _row_size(x: Shape) -> Expr:
    """The elements of one row of ``x`` (its axes after the first, flattened)."""
    size: Expr = Const(1)
    for s in x[1:]:
        size = s if size == Const(1) else size * s
    return size


def _infer_take_matmul(shapes, dtypes, attrs):
    x, idx, w = shapes
    if len(x) < 2 or len(w) != 2:
        raise ShapeError(f"take_matmul needs rows (rank >= 2) and a matrix, got {x} and {w}")
    if not np.issubdtype(dtypes[1], np.integer):
        raise ShapeError(f"take_matmul: index dtype must be integer, got {dtypes[1]}")
    k = _row_size(x)
    if attrs.get("trans", False):
        if len(idx) != 1 or idx[0] != w[0]:
            raise ShapeError(f"take_matmul(trans): {tuple(idx)} rows against {tuple(w)}")
        return (k, w[1]), promote(dtypes[0], dtypes[2])
    if k != w[0]:
        raise ShapeError(f"take_matmul: inner sizes differ: rows of {tuple(x)} @ {tuple(w)}")
    return tuple(idx) + (w[1],), promote(dtypes[0], dtypes[2])


def _vjp_take_matmul(ap, op, i, o, g):
    x, idx, w = i
    size = x.shape[0]

    def rows(m):  # a gradient of the gathered rows, shaped as x's rows
        if len(x.shape) == 2 and len(idx.shape) == 1:
            return m
        return ap("reshape", m, shape=tuple(idx.shape) + tuple(x.shape[1:]))

    if op.attrs.get("trans", False):  # out = x[idx].T @ w
        gx = ap("index_add", rows(ap("matmul", w, swap_last(ap, g))), idx, axis=0, size=size)
        return [gx, None, ap("take_matmul", x, idx, g, trans=False)]
    # out = x[idx] @ w
    gx = ap("index_add", rows(ap("matmul", g, swap_last(ap, w))), idx, axis=0, size=size)
    if len(idx.shape) != 1:
        n = 1
        for s in idx.shape:
            n = n * s
        idx = ap("reshape", idx, shape=(n,))
        g = ap("reshape", g, shape=(n, w.shape[1]))
    return [gx, None, ap("take_matmul", x, idx, g, trans=True)]


def _batch_take_matmul(b: Batch) -> Batched:
    # only the indices batched: ``x[idx] @ w`` for a stack of index vectors is the same
    # product over the stacked indices, the batch axis first (the primitive takes any rank)
    if b.op.attrs.get("trans", False) or b.batched != (False, True, False):
        raise Decline("its matrix or weights change along the dim (or it is a transposed product)")
    return Batched("take_matmul", dict(b.op.attrs))


def _take_matmul_declines(reader: Op, transposed: bool, source: Op) -> str | None:
    return f"{reader.label} gathers from its transpose" if transposed else None


def _gathered_rows(reader: Op, env: Mapping[Bound, int], nrows: int) -> int:
    return int(np.prod([int(x.evaluate(env)) for x in reader.inputs[1].src.shape]))


# x[idx] @ w, or x[idx].T @ w with ``trans`` (each row of x flattened), walking the rows a
# chunk at a time (rowwise.py)
define(
    "take_matmul",
    _infer_take_matmul,
    rowwise.take_matmul,
    _vjp_take_matmul,
    traits=Traits(fresh=True),
    cost=cost.per_output,  # counted by its result (ir/prims/cost.py)
    batching=Batching(_batch_take_matmul),
    rows=Rows(
        row_reader=RowReader(
            _take_matmul_declines,
            lambda reader, _t: bool(reader.attrs.get("trans", False)),
            _gathered_rows,
        )
    ),
    simplify=(),
)
