"""Indexing by tensors (``gather``/``scatter_add``, ``take``/``index_add``) and by a point
(``select_at``/``place_at``, the transposes of temporal slices; ``diag_gather``)."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

import timerl.ir.prims.batching as batching
import timerl.ir.prims.cost as cost
import timerl.ir.prims.rows as rows
from timerl.errors import ShapeError, TimerlError
from timerl.ir.graph import Op, View
from timerl.ir.grid import domain_grid
from timerl.ir.prims.batching import Batch, Batched, Batching, Decline
from timerl.ir.prims.core import Traits, attr_shape, declared
from timerl.ir.prims.define import define
from timerl.ir.prims.rows import Rows
from timerl.ir.prims.table import Declined
from timerl.ir.shapes import norm_axis
from timerl.symbolic import Bound, Const, Expr, as_expr, vevaluate

# --- along an axis, by an index tensor ---------------------------------------------------------


def _infer_gather(shapes, dtypes, attrs):
    x, idx = shapes
    if len(x) != len(idx):
        raise ShapeError(f"gather: index rank {len(idx)} differs from tensor rank {len(x)}")
    if not np.issubdtype(dtypes[1], np.integer):
        raise ShapeError(f"gather: index dtype must be integer, got {dtypes[1]}")
    axis = norm_axis(attrs["axis"], len(x))
    for d, (a, b) in enumerate(zip(x, idx, strict=True)):
        # off the gathered axis the index picks one entry per row of the tensor: same sizes
        # (the backends disagree on anything else: numpy broadcasts, torch reads a corner)
        if d != axis and a.is_const and b.is_const and a != b:
            raise ShapeError(
                f"gather along axis {axis}: index of shape {tuple(idx)} does not match the "
                f"tensor's shape {tuple(x)} on axis {d}"
            )
    return idx, dtypes[0]


def _np_scatter_add(src, idx, axis, shape):
    out = np.zeros(shape, dtype=src.dtype)
    grid = list(np.indices(idx.shape, sparse=True))
    grid[axis] = idx
    np.add.at(out, tuple(grid), src)
    return out


define(
    "gather",
    _infer_gather,
    lambda x, idx, axis: np.take_along_axis(x, idx, axis=axis),
    lambda ap, op, i, o, g: [
        ap("scatter_add", g, i[1], axis=op.attrs["axis"], shape=i[0].shape),
        None,
    ],
    cost=cost.per_output,
    batching=Batching(batching.one_axis_all_batched),
    rows=Rows(blocks=rows.along_other_axis),
    simplify=(),
)
define(
    "scatter_add",
    attr_shape,
    _np_scatter_add,
    lambda ap, op, i, o, g: [ap("gather", g, i[1], axis=op.attrs["axis"]), None],
    cost=cost.per_output,
    batching=Declined("it declares its result's shape per point: no batching rule written"),
    rows=Rows(blocks=rows.along_other_axis),
    simplify=(),
    point_attrs=("shape",),
)


def _infer_take(shapes, dtypes, attrs):
    x, idx = shapes
    axis = norm_axis(attrs["axis"], len(x))
    if not np.issubdtype(dtypes[1], np.integer):
        raise ShapeError(f"take: index dtype must be integer, got {dtypes[1]}")
    return tuple(x[:axis]) + tuple(idx) + tuple(x[axis + 1 :]), dtypes[0]


def _np_index_add(src, idx, axis, size):
    shape = list(src.shape[:axis]) + [size] + list(src.shape[axis + idx.ndim :])
    out = np.zeros(shape, dtype=src.dtype)
    moved = np.moveaxis(out, axis, 0)
    np.add.at(moved, idx.reshape(-1), np.moveaxis(src, axis, 0).reshape((-1,) + moved.shape[1:]))
    return out


def _batch_take(b: Batch) -> Batched:
    if b.batched[1]:
        raise Decline("its index tensor changes along the dim")
    return batching.one_axis(b)


define(
    "take",
    _infer_take,
    lambda x, idx, axis: np.take(x, idx, axis=axis),
    lambda ap, op, i, o, g: [
        ap("index_add", g, i[1], axis=op.attrs["axis"], size=i[0].shape[op.attrs["axis"]]),
        None,
    ],
    cost=cost.per_output,
    batching=Batching(_batch_take),
    rows=Declined("rows picked by an index tensor: no row rule written"),
    simplify=(),
)


def _infer_index_add(shapes, dtypes, attrs):
    src, idx = shapes
    axis = attrs["axis"]
    return (
        tuple(src[:axis]) + (as_expr(attrs["size"]),) + tuple(src[axis + len(idx) :]),
        dtypes[0],
    )


define(
    "index_add",
    _infer_index_add,
    _np_index_add,
    lambda ap, op, i, o, g: [ap("take", g, i[1], axis=op.attrs["axis"]), None],
    cost=cost.per_output,
    batching=Declined("its size is an attribute per point: no batching rule written"),
    rows=Declined("adds rows picked by an index tensor: no row rule written"),
    simplify=(),
    point_attrs=("size",),
)

# --- point-dependent selection (the transpose of temporal slices) ------------------------------


def _infer_select_at(shapes, dtypes, attrs):
    return shapes[0][1:], dtypes[0]


def _batch_select_at(b: Batch) -> Batched:
    """``g[t]`` for every ``t`` of a value over ``0:T`` is the value itself (the transpose of
    a whole-range read, as autodiff builds it)."""
    index = b.op.attrs["index"]
    if b.batched[0] or not (isinstance(index, Expr) and index is b.dim):
        raise Decline("it selects a point other than its own along the dim")
    lead = b.shapes[0][0]
    if not (lead == Const(b.size) or lead is b.dim.bound):
        raise Decline(f"it selects from an axis of size {lead}, not {b.dim.bound.name}")
    return Batched("identity", {}, from_unbatched=True)


def _selects_in_range(op: Op, bounds: Mapping[Bound, int]) -> bool:
    """A select_at's point is an attribute, which validation does not see (autodiff's
    ``g[t]`` of a gradient over ``0:1`` exists only at ``t = 0``)."""
    index = op.attrs["index"]
    size = View(op.inputs[0].src, op.inputs[0].index).shape[0]
    try:
        at = np.asarray(vevaluate(as_expr(index), domain_grid(op.domain, bounds)))
        n = int(size.evaluate(bounds))
    except (KeyError, TimerlError):
        return False
    return bool(np.all((at >= 0) & (at < n)))


define(
    "select_at",
    _infer_select_at,
    lambda x, index: x[index],
    lambda ap, op, i, o, g: [ap("place_at", g, index=op.attrs["index"], size=i[0].shape[0])],
    traits=Traits(view=True, shares_input=True),
    cost=cost.free,
    batching=Batching(_batch_select_at, dim_attrs=("index",), defined=_selects_in_range),
    rows=Declined("one point of a leading axis: no row rule written"),
    simplify=(),
    point_attrs=("index",),
)


def _np_place_at(x, index, size):
    out = np.zeros((size,) + x.shape, dtype=x.dtype)
    out[index] = x
    return out


define(
    "place_at",
    lambda s, d, a: ((as_expr(a["size"]),) + s[0], d[0]),
    _np_place_at,
    lambda ap, op, i, o, g: [ap("select_at", g, index=op.attrs["index"])],
    cost=cost.per_output,
    batching=Declined("it places its value at a point attribute: no batching rule written"),
    rows=Declined("one point of a leading axis: no row rule written"),
    simplify=(),
    point_attrs=("index", "size"),
)


# A position outside x, or an element of another shape than x's, can only come from a point
# where the read did not apply: a clamped window is split into affine pieces, and a piece's
# gradient at the other pieces' points holds zeros of those points' lengths (a window over two
# dims: the other dim's length differs too). The gather is zeros there.
def _np_diag_gather(xs, first, step, shape, dtype, valid=True):
    if len(xs) == 0 or not valid:
        return np.zeros((0 if valid else shape[0],) + tuple(shape[1:]), dtype=dtype)
    if any(x.shape[1:] != tuple(shape[1:]) for x in xs):
        if any(np.any(x) for x in xs):
            raise ValueError(
                f"diag_gather: elements of shape {[x.shape[1:] for x in xs]} hold values where "
                f"x's shape is {tuple(shape[1:])}"
            )
        return np.zeros(tuple(shape), dtype=dtype)
    zero = np.zeros(tuple(shape[1:]), dtype=dtype)
    picks = ((x, first + step * j) for j, x in enumerate(xs))
    return np.stack([x[k] if 0 <= k < len(x) else zero for x, k in picks])


define(
    "diag_gather",
    declared,
    _np_diag_gather,
    None,
    cost=cost.per_output,
    batching=Declined("ragged: its operands' shapes differ from point to point"),
    rows=Declined("ragged: its operands' shapes differ from point to point"),
    simplify=(),
    point_attrs=("first", "shape", "valid"),
    extra={"ragged": True},
)
