"""Products: ``matmul`` (numpy's batched matrix product) and ``take_matmul`` (the product of
gathered rows, walked a chunk at a time so that the gathered rows are never built)."""

from __future__ import annotations

import numpy as np

from timerl.errors import ShapeError
from timerl.ir import rowwise
from timerl.ir.prims.core import Shape, Traits, swap_last, unbroadcast
from timerl.ir.prims.define import define
from timerl.ir.shapes import broadcast, promote
from timerl.symbolic import Const, Expr


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


define(
    "matmul",
    _infer_matmul,
    rowwise.rows_matmul,
    _vjp_matmul,
    traits=Traits(fresh=True),
    # 2 m n k operations; out = m n (batched), the first input m k
    cost=lambda o, i, a: 2.0 * o * (i[0] * i[1] / max(o, 1)) ** 0.5,
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


# x[idx] @ w, or x[idx].T @ w with ``trans`` (each row of x flattened), walking the rows a
# chunk at a time (rowwise.py)
define(
    "take_matmul",
    _infer_take_matmul,
    rowwise.take_matmul,
    _vjp_take_matmul,
    traits=Traits(fresh=True),
    cost=lambda o, i, a: 2.0 * (o * i[1] if a.get("trans") else i[1] * i[2]),
)
