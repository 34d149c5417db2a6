"""Reductions, scans and sorts: ``sum``, ``max``, ``sumsq``, ``argmax``, ``cumsum``, ``argsort``
and ``linear_scan`` (a first-order linear recurrence, made by the compiler)."""

from __future__ import annotations

import numpy as np

import timerl.ir.prims.batching as batching
import timerl.ir.prims.cost as cost
import timerl.ir.prims.rows as rows
from timerl.errors import ShapeError
from timerl.ir import rowwise
from timerl.ir.prims.batching import Batching
from timerl.ir.prims.core import Traits
from timerl.ir.prims.define import define
from timerl.ir.prims.rows import Rows, const_size, reduced_axes
from timerl.ir.prims.table import Declined
from timerl.ir.shapes import ONE, norm_axis

REDUCTION = Traits(reduction=True)


def axes_of(attrs, rank: int) -> tuple[int, ...]:
    """The axes a reduction's attributes name, sorted and non-negative (all by default)."""
    axes = attrs.get("axes")
    if axes is None:
        return tuple(range(rank))
    return tuple(sorted(norm_axis(a, rank) for a in axes))


def _infer_reduce(shapes, dtypes, attrs):
    shape = shapes[0]
    axes = axes_of(attrs, len(shape))
    keep = attrs.get("keepdims", False)
    out = tuple(ONE if k in axes else s for k, s in enumerate(shape) if keep or k not in axes)
    dtype = dtypes[0]
    if attrs.get("_sum") and dtype == np.dtype(bool):
        dtype = np.dtype("int64")
    return out, dtype


def _restore(ap, g, shape, axes, keepdims):
    if not keepdims:
        g = ap("reshape", g, shape=tuple(ONE if k in axes else s for k, s in enumerate(shape)))
    return g


def _vjp_sum(ap, op, i, o, g):
    shape = i[0].shape
    axes = axes_of(op.attrs, len(shape))
    g = _restore(ap, g, shape, axes, op.attrs.get("keepdims", False))
    return [ap("expand", g, shape=shape)]


def _vjp_max(ap, op, i, o, g):
    shape = i[0].shape
    axes = axes_of(op.attrs, len(shape))
    keep = op.attrs.get("keepdims", False)
    g = _restore(ap, g, shape, axes, keep)
    out = _restore(ap, o, shape, axes, keep)
    hit = ap("cast", ap("eq", i[0], out), dtype=g.dtype)
    count = ap("sum", hit, axes=axes, keepdims=True)
    return [ap("div", ap("mul", hit, g), count)]


def _np_max(x, axes=None, keepdims=False, _sum=False):
    return np.asarray(np.max(x, axis=axes, keepdims=keepdims))


def _np_sum(x, axes=None, keepdims=False, _sum=False):
    return rowwise.leading_sum(x, axes, keepdims)


def _sum_rows(op, shapes):
    """A sum over the leading axis, by blocks of rows: the sum of the blocks' sums."""
    if not shapes[0] or 0 not in reduced_axes(op, len(shapes[0])):
        return {}
    n = const_size(shapes[0][0])
    return {n: (0,)} if n else {}


define(
    "sum",
    _infer_reduce,
    _np_sum,
    _vjp_sum,
    traits=REDUCTION,
    cost=cost.per_input,
    batching=Batching(batching.reduce_axes),
    rows=Rows(blocks=rows.reduce_other, accumulates=_sum_rows, stacks=rows.reduce_key),
    simplify=(),
)
define(
    "max",
    _infer_reduce,
    _np_max,
    _vjp_max,
    traits=REDUCTION,
    cost=cost.per_input,
    batching=Batching(batching.reduce_axes),
    rows=Rows(blocks=rows.reduce_other, stacks=rows.reduce_key),
    simplify=(),
)


def _infer_sumsq(shapes, dtypes, attrs):
    if not np.issubdtype(dtypes[0], np.floating):
        raise ShapeError(f"sumsq needs a floating-point input, got {dtypes[0]}")
    return (), dtypes[0]


def _vjp_sumsq(ap, op, i, o, g):
    return [ap("mul", ap("add", i[0], i[0]), g)]


def _sumsq_rows(op, shapes):
    n = const_size(shapes[0][0]) if shapes[0] else None
    return {n: (0,)} if n else {}


# the sum of all squares without the squares as an array (a gradient's norm: one dot product,
# not a temporary the size of the weights)
define(
    "sumsq",
    _infer_sumsq,
    lambda x: np.asarray(np.vdot(x, x)),
    _vjp_sumsq,
    traits=REDUCTION,
    cost=cost.per_input,
    batching=Declined("it sums every axis: batched, it would need a sum per point"),
    rows=Rows(accumulates=_sumsq_rows),
    simplify=(),
)


def _infer_argmax(shapes, dtypes, attrs):
    shape = shapes[0]
    axis = norm_axis(attrs["axis"], len(shape))
    keep = attrs.get("keepdims", False)
    out = tuple(ONE if k == axis else s for k, s in enumerate(shape) if keep or k != axis)
    return out, np.dtype("int64")


define(
    "argmax",
    _infer_argmax,
    lambda x, axis, keepdims=False: np.argmax(x, axis=axis, keepdims=keepdims),
    traits=REDUCTION,
    cost=cost.per_input,
    batching=Batching(batching.one_axis),
    rows=Declined("an index along one axis: no row rule written"),
    simplify=(),
    differentiable=False,
)

# --- scans and sorts ---------------------------------------------------------------------------


def _np_cumsum(x, axis, reverse=False):
    if reverse:
        return np.flip(np.cumsum(np.flip(x, axis), axis=axis), axis)
    return np.cumsum(x, axis=axis)


define(
    "cumsum",
    lambda s, d, a: (s[0], d[0]),
    _np_cumsum,
    lambda ap, op, i, o, g: [
        ap("cumsum", g, axis=op.attrs["axis"], reverse=not op.attrs.get("reverse", False))
    ],
    cost=cost.per_output,
    batching=Batching(batching.one_axis),
    rows=Declined("a scan along an axis: no row rule written (along the rows it mixes them)"),
    simplify=(),
)


def _np_linear_scan(a, c, base, reverse=False):
    """``x[t] = a[t] + c[t] * x[t + 1]`` for ``t < T - 1`` and ``x[T - 1] = base``
    (``reverse``), or ``x[t] = a[t] + c[t] * x[t - 1]`` for ``t >= 1`` and ``x[0] = base``: a
    first-order linear recurrence over the leading axis of ``a`` and ``c`` (GAE, discounted
    returns; their row at the base's point is not used). Each row is computed as the
    point-by-point program computes it (a product, then a sum), into one array. ``a`` has the
    result's shape; ``base`` (a number written to a spatial tensor) and ``c`` may broadcast."""
    steps = len(a)
    out = np.empty(np.shape(a), dtype=np.result_type(a, c, base))
    if steps == 0:
        return out
    out[steps - 1 if reverse else 0] = base
    for t in range(steps - 2, -1, -1) if reverse else range(1, steps):
        prev = t + 1 if reverse else t - 1
        row = out[t, ...]  # a view also of a 0-d row
        np.multiply(c[t], out[prev, ...], out=row)
        np.add(a[t], row, out=row)
    return out


define(
    "linear_scan",
    lambda s, d, a: (
        s[0],
        d[0],
    ),  # ``a``'s rows have the recurrence's shape; the base may broadcast
    _np_linear_scan,
    traits=Traits(fresh=True),
    cost=cost.per_output,
    batching=Declined("a recurrence along its leading axis: no batching rule written"),
    rows=Declined("a recurrence along its rows mixes them"),
    simplify=(),
    differentiable=False,  # made by the compiler (compiler/scan.py), after autodiff
)
define(
    "argsort",
    lambda s, d, a: (s[0], np.dtype("int64")),
    lambda x, axis: np.argsort(x, axis=axis, kind="stable"),
    cost=cost.sort,
    batching=Batching(batching.one_axis),
    rows=Declined("a sort along an axis: no row rule written"),
    simplify=(),
    differentiable=False,
)
