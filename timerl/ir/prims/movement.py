"""Movement primitives: ``reshape``, ``permute``, ``expand``, ``narrow``, ``pad_axis``, ``cat``,
and numpy-style indexing by a static key (``getitem`` and its transpose ``getitem_grad``)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

import numpy as np

import timerl.ir.prims.batching as batching
import timerl.ir.prims.cost as cost
import timerl.ir.prims.rows as rows
from timerl.errors import ShapeError
from timerl.ir.prims.batching import Batch, Batched, Batching, Decline, point_rank
from timerl.ir.prims.core import Shape, Traits, attr_shape, unbroadcast
from timerl.ir.prims.define import define
from timerl.ir.prims.rows import Rows, const_prod, const_size
from timerl.ir.prims.simplify import no_op_cast
from timerl.ir.prims.table import Declined
from timerl.ir.rowwise import RowSource
from timerl.ir.shapes import ONE, broadcast, norm_axis, promote
from timerl.symbolic import Bound, Const, Expr, as_expr

# a view of its whole input (allocates nothing; a reshape of a strided one may copy)
CONTIGUOUS_VIEW = Traits(view=True, shares_input=True, whole_view="contiguous")
STRIDED_VIEW = Traits(view=True, shares_input=True, whole_view="strided")
PART_VIEW = Traits(view=True, shares_input=True)  # a view of part of its input


def _np_reshape(x, shape):
    return x.reshape(tuple(shape)) if isinstance(x, RowSource) else np.reshape(x, shape)


def _infer_reshape(shapes, dtypes, attrs):
    return tuple(as_expr(s) for s in attrs["shape"]), dtypes[0]


def _reshape_blocks(op, axis: int, out: Shape, shapes: Sequence[Shape]) -> tuple[int | None, ...]:
    src = shapes[0]
    if any(const_size(s) is None for s in (*src, *out)):
        raise rows.Decline("a reshape of a symbolic shape")
    before = const_prod(out[:axis])
    for at in range(len(src)):
        if const_prod(src[:at]) == before and const_size(src[at]) == const_size(out[axis]):
            return (at,)
    raise rows.Decline("a reshape that mixes the rows with other axes")


def _reshape_key(op, vals) -> tuple:
    # the row count is checked by the caller (output rows = input rows); the rest is per row
    return (op.prim, tuple(str(s) for s in op.attrs["shape"][1:]))


define(
    "reshape",
    _infer_reshape,
    _np_reshape,
    lambda ap, op, i, o, g: [ap("reshape", g, shape=i[0].shape)],
    traits=replace(CONTIGUOUS_VIEW, reshapes=True),
    cost=cost.free,
    batching=Batching(batching.new_shape),
    rows=Rows(blocks=_reshape_blocks, stacks=_reshape_key, row_view=rows.keeps_rows),
    simplify=(no_op_cast,),  # to the shape it has
    point_attrs=("shape",),
)


def _infer_permute(shapes, dtypes, attrs):
    perm = attrs["perm"]
    if sorted(perm) != list(range(len(shapes[0]))):
        raise ShapeError(f"permute: {perm} is not a permutation of {len(shapes[0])} axes")
    return tuple(shapes[0][p] for p in perm), dtypes[0]


def _batch_permute(b: Batch) -> Batched:
    attrs = dict(b.op.attrs)
    attrs["perm"] = (0, *(int(p) + 1 for p in attrs["perm"]))
    return Batched(b.op.prim, attrs)


def _permute_blocks(op, axis: int, out: Shape, shapes: Sequence[Shape]) -> tuple[int | None, ...]:
    return (tuple(op.attrs["perm"])[axis],)


def _transposes_rows(view, transposed: bool, static: Mapping[Bound, int]) -> str | None:
    """Rows on demand are transposed as a matrix, once (a matmul reads ``x.T`` by chunks)."""
    if tuple(view.attrs.get("perm", ())) != (1, 0) or transposed:
        return f"{view.label} permutes its axes"
    return None


define(
    "permute",
    _infer_permute,
    lambda x, perm: x.permute(perm) if isinstance(x, RowSource) else np.transpose(x, perm),
    lambda ap, op, i, o, g: [ap("permute", g, perm=tuple(np.argsort(op.attrs["perm"])))],
    traits=STRIDED_VIEW,
    cost=cost.free,
    batching=Batching(_batch_permute),
    rows=Rows(blocks=_permute_blocks, row_view=_transposes_rows, transposes=True),
    simplify=(),
)


def _infer_expand(shapes, dtypes, attrs):
    target = tuple(as_expr(s) for s in attrs["shape"])
    if broadcast(shapes[0], target, what="expand") != target:
        raise ShapeError(f"cannot expand shape {shapes[0]} to {target}")
    return target, dtypes[0]


def _batch_expand(b: Batch) -> Batched:
    out = batching.new_shape(b)
    return Batched(out.prim, out.attrs, operand_rank=point_rank(b))


define(
    "expand",
    _infer_expand,
    lambda x, shape: np.broadcast_to(x, shape),
    lambda ap, op, i, o, g: [unbroadcast(ap, g, i[0].shape)],
    traits=Traits(view=True, shares_input=True, whole_view="strided", broadcast=True),
    cost=cost.free,
    batching=Batching(_batch_expand),
    rows=Rows(blocks=rows.elementwise_blocks),
    simplify=(),
    point_attrs=("shape",),
)

# --- indexing by a static key ------------------------------------------------------------------


def _key_shape(shape: Shape, key: tuple) -> Shape:
    out: list[Expr] = []
    if sum(k is Ellipsis for k in key) > 1:
        raise ShapeError("an index can have only one ellipsis")
    real = sum(1 for k in key if k is not None and k is not Ellipsis)
    if real > len(shape):
        raise ShapeError(f"too many indices ({real}) for a tensor of rank {len(shape)}")
    if Ellipsis in key:
        at = key.index(Ellipsis)
        key = key[:at] + (slice(None),) * (len(shape) - real) + key[at + 1 :]
    key = key + (slice(None),) * (len(shape) - sum(1 for k in key if k is not None))
    axis = 0
    for k in key:
        if k is None:
            out.append(ONE)
            continue
        size = shape[axis]
        axis += 1
        if isinstance(k, int):
            if isinstance(size, Const) and not -size.value <= k < size.value:
                raise ShapeError(f"index {k} is out of range for an axis of size {size}")
            continue
        if k == slice(None):
            out.append(size)
        elif isinstance(size, Const):
            out.append(Const(len(range(*k.indices(size.value)))))
        else:
            raise ShapeError(f"slicing an axis of dynamic size {size} with {k} is not supported")
    return tuple(out)


def _infer_getitem(shapes, dtypes, attrs):
    return _key_shape(shapes[0], attrs["key"]), dtypes[0]


def _np_zeros_put(g, key, shape):
    out = np.zeros(shape, dtype=g.dtype)
    out[key] += g
    return out


def _static_key(key: Any) -> tuple:
    key = key if isinstance(key, tuple) else (key,)
    for k in key:
        if not (k is None or k is Ellipsis or isinstance(k, (int, slice))):
            raise Decline(f"index {k!r} is not static")
    return key


def _batch_getitem(b: Batch) -> Batched:
    attrs = dict(b.op.attrs)
    attrs["key"] = (slice(None), *_static_key(attrs["key"]))
    return Batched(b.op.prim, attrs)


def _batch_getitem_grad(b: Batch) -> Batched:
    out = _batch_getitem(b)
    out.attrs["shape"] = (Const(b.size), *out.attrs["shape"])
    return out


def basic_key(key: Any) -> bool:
    """numpy basic indexing (ints, slices, None, ...) returns a view; anything else copies."""
    items = key if isinstance(key, tuple) else (key,)
    return all(
        k is None
        or k is Ellipsis
        or isinstance(k, slice)
        or (isinstance(k, (int, np.integer)) and not isinstance(k, (bool, np.bool_)))
        for k in items
    )


def _getitem_view(attrs: Mapping[str, Any]) -> bool:
    return basic_key(attrs.get("key", ()))


def _getitem_cost(sizes: cost.Sizes, attrs: Mapping[str, Any]) -> float:
    """A basic key is a view (nothing computed); an advanced one gathers its result."""
    return 0.0 if _getitem_view(attrs) else float(sizes.out())


_KEY_ROWS = Declined("a key may pick or mix rows: no row rule written")
# basic indexing (ints, slices, None, Ellipsis) is a view on numpy and torch, advanced indexing
# a copy: a view where it may be one, though it is no view of its own (it may allocate)
define(
    "getitem",
    _infer_getitem,
    lambda x, key: np.asarray(x[key]),
    lambda ap, op, i, o, g: [ap("getitem_grad", g, key=op.attrs["key"], shape=i[0].shape)],
    traits=Traits(shares_input=True),
    cost=_getitem_cost,
    batching=Batching(_batch_getitem),
    rows=_KEY_ROWS,
    simplify=(),
    view_when=_getitem_view,
)
define(
    "getitem_grad",
    attr_shape,
    _np_zeros_put,
    lambda ap, op, i, o, g: [ap("getitem", g, key=op.attrs["key"])],
    cost=cost.per_output,
    batching=Batching(_batch_getitem_grad),
    rows=_KEY_ROWS,
    simplify=(),
    point_attrs=("shape",),
)

# --- parts along one axis ----------------------------------------------------------------------


def _infer_narrow(shapes, dtypes, attrs):
    shape = list(shapes[0])
    axis = norm_axis(attrs["axis"], len(shape))
    shape[axis] = as_expr(attrs["length"])
    return tuple(shape), dtypes[0]


def _np_narrow(x, axis, start, length):
    idx = [slice(None)] * x.ndim
    idx[axis] = slice(start, start + length)
    return x[tuple(idx)]


define(
    "narrow",
    _infer_narrow,
    _np_narrow,
    lambda ap, op, i, o, g: [
        ap(
            "pad_axis",
            g,
            axis=op.attrs["axis"],
            before=op.attrs["start"],
            size=i[0].shape[norm_axis(op.attrs["axis"], len(i[0].shape))],
        )
    ],
    traits=PART_VIEW,
    cost=cost.free,
    batching=Batching(batching.one_axis),
    rows=Declined("a part along an axis: no row rule written"),
    simplify=(),
    point_attrs=("start", "length"),
)


def _infer_pad_axis(shapes, dtypes, attrs):
    shape = list(shapes[0])
    shape[norm_axis(attrs["axis"], len(shape))] = as_expr(attrs["size"])
    return tuple(shape), dtypes[0]


def _np_pad_axis(x, axis, before, size):
    shape = list(x.shape)
    shape[axis] = size
    out = np.zeros(shape, dtype=x.dtype)
    idx = [slice(None)] * x.ndim
    idx[axis] = slice(before, before + x.shape[axis])
    out[tuple(idx)] = x
    return out


define(
    "pad_axis",
    _infer_pad_axis,
    _np_pad_axis,
    lambda ap, op, i, o, g: [
        ap(
            "narrow",
            g,
            axis=op.attrs["axis"],
            start=op.attrs["before"],
            length=i[0].shape[norm_axis(op.attrs["axis"], len(i[0].shape))],
        )
    ],
    cost=cost.per_output,
    batching=Batching(batching.one_axis),
    rows=Declined("zeros around its input along an axis: no row rule written"),
    simplify=(),
    point_attrs=("before", "size"),
)


def _infer_cat(shapes, dtypes, attrs):
    rank = len(shapes[0])
    axis = norm_axis(attrs["axis"], rank)
    total: Expr = Const(0)
    for s in shapes:
        if len(s) != rank:
            raise ShapeError(f"cat: operands have ranks {[len(x) for x in shapes]}")
        for k in range(rank):
            if k != axis and s[k] != shapes[0][k]:
                raise ShapeError(f"cat: shapes {[tuple(x) for x in shapes]} differ off axis {axis}")
        total = total + s[axis]
    out = list(shapes[0])
    out[axis] = total
    return tuple(out), promote(*dtypes)


def _vjp_cat(ap, op, i, o, g):
    axis = norm_axis(op.attrs["axis"], len(o.shape))
    start: Expr = Const(0)
    grads = []
    for x in i:
        grads.append(ap("narrow", g, axis=axis, start=start, length=x.shape[axis]))
        start = start + x.shape[axis]
    return grads


define(
    "cat",
    _infer_cat,
    lambda *xs, axis: np.concatenate(xs, axis=axis),
    _vjp_cat,
    cost=cost.per_output,
    batching=Batching(batching.one_axis_all_batched),
    rows=Declined("operands laid end to end along an axis: no row rule written"),
    simplify=(),
)
