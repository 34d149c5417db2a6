"""The primitive op registry: one entry per primitive holds what the primitive *means*.

An entry has the shape/dtype inference rule, the backward (VJP) rule, typed traits (what passes
and executors may rely on), a cost estimate, and ``impl``: the numpy reference semantics, which
constant folding evaluates and the numpy backend runs. How another backend computes a primitive
is that backend's business: its lowerings live in its own module (``runtime/torch_lowering.py``),
so this module imports no array library but numpy. Backward rules build new ops through the
``ap`` callback (``ir.build.apply``), so this module needs nothing from the rest of the IR.

Composite ops (softmax, losses, distributions) are built from these in ``api/``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from timerl.errors import ProgramError, ShapeError
from timerl.ir import counter_rng, rowwise, special
from timerl.ir.rowwise import RowSource
from timerl.ir.shapes import ONE, broadcast, norm_axis, promote
from timerl.symbolic import Const, Expr, as_expr

Shape = tuple[Expr, ...]
Infer = Callable[[list[Shape], list[np.dtype], dict[str, Any]], tuple[Shape, np.dtype]]


@dataclass(frozen=True)
class Traits:
    """What passes, executors and exporters may rely on, so none of them tests a name.

    ``mergeable`` ops may be merged with a duplicate and folded when their inputs are
    constant; ``view`` ops may return (part of) an input's buffer, so they allocate nothing of
    their own; ``piecewise`` ops pick one input per point by the edges' conditions (the
    program's tensors); ``host`` ops call user Python (the function in their ``fn`` attr, on
    numpy arrays, outside any backend); ``constant`` ops hold a value fixed when the program is
    built; ``broadcast`` ops repeat their input along new or unit axes, so every element along
    those axes is the same; ``multi_output`` ops return a tuple of arrays that ``tuple_get``
    readers take apart (their declared shape and dtype describe nothing).
    """

    elementwise: bool = False
    reduction: bool = False
    view: bool = False
    random: bool = False
    piecewise: bool = False
    host: bool = False
    constant: bool = False
    stops_gradient: bool = False
    broadcast: bool = False
    multi_output: bool = False
    # its kernel always returns a new array of its own, never an input's buffer, so a later op
    # may write into it (donation)
    fresh: bool = False
    # its kernel may return (part of) an input's buffer on some backend (numpy's and torch's
    # basic indexing, a view, a merge handing on its branch, user Python returning what it was
    # given): while its value lives, a write into that input's buffer (a donation, a circular
    # buffer's row) would change it too. Every view has it; tests/ir/test_prims.py checks each
    # lowering that returns shared memory declares it
    shares_input: bool = False
    # a view of its whole input: ``"contiguous"`` when it is the input's buffer or a
    # contiguous view of a contiguous input (identity, detach, reshape), ``"strided"`` when it
    # is always a view but may be strided, so a reshape of it may copy (permute, expand);
    # storage lets a block's rows be read through such views without a copy
    whole_view: str | None = None

    @property
    def mergeable(self) -> bool:
        return not (self.random or self.piecewise or self.host)


def _flops(out_size: int, in_sizes: list[int], attrs: dict[str, Any]) -> float:
    """Default cost: one operation per output element."""
    return float(out_size)


@dataclass(frozen=True)
class Prim:
    name: str
    infer: Infer
    impl: Callable[..., Any]  # reference semantics (numpy): what constant folding evaluates
    vjp: Callable[..., list[Any]] | None = None
    elementwise: bool = False
    point_attrs: tuple[str, ...] = ()  # attrs that are index expressions, evaluated per point
    array_attrs: tuple[str, ...] = ()  # array-valued attrs, made the backend's arrays once
    keyed: bool = False  # pure random op: receives a counter-based key (seed, op, point)
    differentiable: bool = True
    extra: dict[str, Any] = field(default_factory=dict)
    traits: Traits = Traits()
    # cost estimate in elementary operations, from element counts (used to order and place)
    cost: Callable[[int, list[int], dict[str, Any]], float] = _flops


REGISTRY: dict[str, Prim] = {}


def register(prim: Prim) -> Prim:
    REGISTRY[prim.name] = prim
    return prim


def table_rule(table: dict[str, Any], prim: str, elementwise: Any, *unless: str) -> Any:
    """A transformation's rule for ``prim`` (JAX's model: each transformation keeps its own
    table): the table's entry, else ``elementwise`` for an elementwise primitive that has
    none of the ``unless`` traits, else None."""
    if prim in table:
        return table[prim]
    traits = get(prim).traits
    if traits.elementwise and not any(getattr(traits, t) for t in unless):
        return elementwise
    return None


def get(name: str) -> Prim:
    try:
        return REGISTRY[name]
    except KeyError:
        raise KeyError(f"unknown primitive {name!r}") from None


# --- inference helpers -----------------------------------------------------------------------


def _same(shapes, dtypes, attrs):
    return shapes[0], dtypes[0]


def _float_same(shapes, dtypes, attrs):
    dt = dtypes[0] if np.issubdtype(dtypes[0], np.floating) else np.dtype("float32")
    return shapes[0], dt


def _bool_same(shapes, dtypes, attrs):
    return shapes[0], np.dtype(bool)


def _binary(shapes, dtypes, attrs):
    return broadcast(*shapes), promote(*dtypes)


def _compare(shapes, dtypes, attrs):
    return broadcast(*shapes), np.dtype(bool)


def _declared(shapes, dtypes, attrs):
    return tuple(as_expr(s) for s in attrs["shape"]), np.dtype(attrs["dtype"])


# --- backward helpers: ``ap(prim, *views, **attrs)`` builds an op and returns its view --------


def _unbroadcast(ap, g, shape: Shape):
    """Sum a gradient back to an operand's shape after broadcasting."""
    gshape = g.shape
    lead = len(gshape) - len(shape)
    axes = list(range(lead))
    axes += [lead + k for k, s in enumerate(shape) if s == ONE and gshape[lead + k] != ONE]
    if axes:
        g = ap("sum", g, axes=tuple(axes), keepdims=True)
        if lead:
            g = ap("reshape", g, shape=tuple(shape))
    return g


def _c(ap, value: float, like):
    return ap("full", shape=(), value=value, dtype=like.dtype)


def _unary(name, np_fn, vjp=None, infer=_float_same):
    register(Prim(name, infer, np_fn, vjp, elementwise=True))


def _binary_op(name, np_fn, vjp=None, infer=_binary):
    register(Prim(name, infer, np_fn, vjp, elementwise=True))


# --- elementwise unary -----------------------------------------------------------------------

_unary("neg", np.negative, lambda ap, op, i, o, g: [ap("neg", g)], _same)
_unary("exp", np.exp, lambda ap, op, i, o, g: [ap("mul", g, o)])
_unary("log", np.log, lambda ap, op, i, o, g: [ap("div", g, i[0])])
_unary(
    "tanh",
    np.tanh,
    lambda ap, op, i, o, g: [ap("mul", g, ap("sub", _c(ap, 1.0, o), ap("mul", o, o)))],
)
_unary(
    "sigmoid",
    lambda x: np.where(
        x >= 0, 1 / (1 + np.exp(-np.abs(x))), 1 - 1 / (1 + np.exp(-np.abs(x)))
    ).astype(x.dtype, copy=False),
    lambda ap, op, i, o, g: [ap("mul", g, ap("mul", o, ap("sub", _c(ap, 1.0, o), o)))],
)
_unary(
    "sqrt",
    np.sqrt,
    lambda ap, op, i, o, g: [ap("div", g, ap("mul", _c(ap, 2.0, o), o))],
)
_unary(
    "abs",
    np.abs,
    lambda ap, op, i, o, g: [ap("mul", g, ap("sign", i[0]))],
    _same,
)
_unary("sign", np.sign, lambda ap, op, i, o, g: [None], _same)
_unary("sin", np.sin, lambda ap, op, i, o, g: [ap("mul", g, ap("cos", i[0]))])
_unary(
    "cos",
    np.cos,
    lambda ap, op, i, o, g: [ap("neg", ap("mul", g, ap("sin", i[0])))],
)
_unary("lgamma", special.lgamma, lambda ap, op, i, o, g: [ap("mul", g, ap("digamma", i[0]))])
_unary("digamma", special.digamma, lambda ap, op, i, o, g: [ap("mul", g, ap("trigamma", i[0]))])


def _no_tetragamma(ap, op, i, o, g):
    raise ProgramError(
        f"{op.where()}: trigamma has no gradient here (its derivative, the tetragamma "
        "function, is not implemented)"
    )


_unary("trigamma", special.trigamma, _no_tetragamma)
_unary("logical_not", np.logical_not, None, _bool_same)
_unary("floor", np.floor, lambda ap, op, i, o, g: [None], _same)

# --- elementwise binary ----------------------------------------------------------------------


def _vjp_add(ap, op, i, o, g):
    return [_unbroadcast(ap, g, i[0].shape), _unbroadcast(ap, g, i[1].shape)]


def _vjp_sub(ap, op, i, o, g):
    return [_unbroadcast(ap, g, i[0].shape), _unbroadcast(ap, ap("neg", g), i[1].shape)]


def _vjp_mul(ap, op, i, o, g):
    return [
        _unbroadcast(ap, ap("mul", g, i[1]), i[0].shape),
        _unbroadcast(ap, ap("mul", g, i[0]), i[1].shape),
    ]


def _vjp_div(ap, op, i, o, g):
    ga = ap("div", g, i[1])
    gb = ap("neg", ap("div", ap("mul", g, o), i[1]))
    return [_unbroadcast(ap, ga, i[0].shape), _unbroadcast(ap, gb, i[1].shape)]


def _vjp_pow(ap, op, i, o, g):
    a, b = i
    ga = ap("mul", g, ap("mul", b, ap("pow", a, ap("sub", b, _c(ap, 1.0, b)))))
    safe = ap("where", ap("gt", a, _c(ap, 0.0, a)), a, _c(ap, 1.0, a))
    gb = ap("mul", g, ap("mul", o, ap("log", safe)))
    return [_unbroadcast(ap, ga, a.shape), _unbroadcast(ap, gb, b.shape)]


def _vjp_extremum(cmp: str):
    def rule(ap, op, i, o, g):
        pick = ap(cmp, i[0], i[1])
        zero = _c(ap, 0.0, g)
        return [
            _unbroadcast(ap, ap("where", pick, g, zero), i[0].shape),
            _unbroadcast(ap, ap("where", pick, zero, g), i[1].shape),
        ]

    return rule


def _np_div(a, b):
    out = np.divide(a, b)  # a fresh array: ``astype`` copies only where the dtype differs
    return (
        out.astype(np.result_type(a, b), copy=False)
        if np.issubdtype(np.result_type(a, b), np.floating)
        else out
    )


_binary_op("add", np.add, _vjp_add)
_binary_op("sub", np.subtract, _vjp_sub)
_binary_op("mul", np.multiply, _vjp_mul)
_binary_op(
    "div",
    _np_div,
    _vjp_div,
    lambda s, d, a: (broadcast(*s), np.result_type(promote(*d), np.float32)),
)
_binary_op("pow", np.power, _vjp_pow)
_binary_op("floordiv", np.floor_divide)
_binary_op("mod", np.mod)
_binary_op("maximum", np.maximum, _vjp_extremum("ge"))
_binary_op("minimum", np.minimum, _vjp_extremum("le"))
for _name, _np in [
    ("lt", np.less),
    ("le", np.less_equal),
    ("gt", np.greater),
    ("ge", np.greater_equal),
    ("eq", np.equal),
    ("ne", np.not_equal),
    ("logical_and", np.logical_and),
    ("logical_or", np.logical_or),
]:
    _binary_op(_name, _np, None, _compare)


def _infer_where(shapes, dtypes, attrs):
    if dtypes[0] != np.dtype(bool):
        raise ShapeError(f"where: the condition must be bool, got {dtypes[0]}")
    return broadcast(*shapes, what="where operands"), promote(dtypes[1], dtypes[2])


def _vjp_where(ap, op, i, o, g):
    zero = _c(ap, 0.0, g)
    return [
        None,
        _unbroadcast(ap, ap("where", i[0], g, zero), i[1].shape),
        _unbroadcast(ap, ap("where", i[0], zero, g), i[2].shape),
    ]


register(
    Prim(
        "where",
        _infer_where,
        lambda c, a, b: np.where(c, a, b).astype(np.result_type(a, b), copy=False),
        _vjp_where,
        elementwise=True,
    )
)


def _infer_cast(shapes, dtypes, attrs):
    return shapes[0], np.dtype(attrs["dtype"])


register(
    Prim(
        "cast",
        _infer_cast,
        lambda x, dtype: np.asarray(x).astype(dtype),
        lambda ap, op, i, o, g: (
            [ap("cast", g, dtype=i[0].dtype)] if np.issubdtype(i[0].dtype, np.floating) else [None]
        ),
        elementwise=True,
    )
)
for _name in ("identity", "detach"):
    register(
        Prim(
            _name,
            _same,
            lambda x: x,
            (lambda ap, op, i, o, g: [g]) if _name == "identity" else None,
            elementwise=True,
            differentiable=_name == "identity",
        )
    )

# --- reductions ------------------------------------------------------------------------------


def _axes(attrs, rank: int) -> tuple[int, ...]:
    axes = attrs.get("axes")
    if axes is None:
        return tuple(range(rank))
    return tuple(sorted(norm_axis(a, rank) for a in axes))


def _infer_reduce(shapes, dtypes, attrs):
    shape = shapes[0]
    axes = _axes(attrs, len(shape))
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
    axes = _axes(op.attrs, len(shape))
    g = _restore(ap, g, shape, axes, op.attrs.get("keepdims", False))
    return [ap("expand", g, shape=shape)]


def _vjp_max(ap, op, i, o, g):
    shape = i[0].shape
    axes = _axes(op.attrs, len(shape))
    keep = op.attrs.get("keepdims", False)
    g = _restore(ap, g, shape, axes, keep)
    out = _restore(ap, o, shape, axes, keep)
    hit = ap("cast", ap("eq", i[0], out), dtype=g.dtype)
    count = ap("sum", hit, axes=axes, keepdims=True)
    return [ap("div", ap("mul", hit, g), count)]


def _np_reduce(fn):
    def run(x, axes=None, keepdims=False, _sum=False):
        return np.asarray(fn(x, axis=axes, keepdims=keepdims))

    return run


def _np_sum(x, axes=None, keepdims=False, _sum=False):
    return rowwise.leading_sum(x, axes, keepdims)


register(Prim("sum", _infer_reduce, _np_sum, _vjp_sum))
register(Prim("max", _infer_reduce, _np_reduce(np.max), _vjp_max))


def _infer_sumsq(shapes, dtypes, attrs):
    if not np.issubdtype(dtypes[0], np.floating):
        raise ShapeError(f"sumsq needs a floating-point input, got {dtypes[0]}")
    return (), dtypes[0]


def _vjp_sumsq(ap, op, i, o, g):
    return [ap("mul", ap("add", i[0], i[0]), g)]


# the sum of all squares without the squares as an array (a gradient's norm: one dot product,
# not a temporary the size of the weights)
register(Prim("sumsq", _infer_sumsq, lambda x: np.asarray(np.vdot(x, x)), _vjp_sumsq))


def _infer_argmax(shapes, dtypes, attrs):
    shape = shapes[0]
    axis = norm_axis(attrs["axis"], len(shape))
    keep = attrs.get("keepdims", False)
    out = tuple(ONE if k == axis else s for k, s in enumerate(shape) if keep or k != axis)
    return out, np.dtype("int64")


register(
    Prim(
        "argmax",
        _infer_argmax,
        lambda x, axis, keepdims=False: np.argmax(x, axis=axis, keepdims=keepdims),
        differentiable=False,
    )
)

# --- movement --------------------------------------------------------------------------------


def _np_reshape(x, shape):
    return x.reshape(tuple(shape)) if isinstance(x, RowSource) else np.reshape(x, shape)


def _infer_reshape(shapes, dtypes, attrs):
    return tuple(as_expr(s) for s in attrs["shape"]), dtypes[0]


register(
    Prim(
        "reshape",
        _infer_reshape,
        _np_reshape,
        lambda ap, op, i, o, g: [ap("reshape", g, shape=i[0].shape)],
        point_attrs=("shape",),
    )
)


def _infer_permute(shapes, dtypes, attrs):
    perm = attrs["perm"]
    if sorted(perm) != list(range(len(shapes[0]))):
        raise ShapeError(f"permute: {perm} is not a permutation of {len(shapes[0])} axes")
    return tuple(shapes[0][p] for p in perm), dtypes[0]


register(
    Prim(
        "permute",
        _infer_permute,
        lambda x, perm: x.permute(perm) if isinstance(x, RowSource) else np.transpose(x, perm),
        lambda ap, op, i, o, g: [ap("permute", g, perm=tuple(np.argsort(op.attrs["perm"])))],
    )
)


def _infer_expand(shapes, dtypes, attrs):
    target = tuple(as_expr(s) for s in attrs["shape"])
    if broadcast(shapes[0], target, what="expand") != target:
        raise ShapeError(f"cannot expand shape {shapes[0]} to {target}")
    return target, dtypes[0]


register(
    Prim(
        "expand",
        _infer_expand,
        lambda x, shape: np.broadcast_to(x, shape),
        lambda ap, op, i, o, g: [_unbroadcast(ap, g, i[0].shape)],
        point_attrs=("shape",),
    )
)


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


register(
    Prim(
        "getitem",
        _infer_getitem,
        lambda x, key: np.asarray(x[key]),
        lambda ap, op, i, o, g: [ap("getitem_grad", g, key=op.attrs["key"], shape=i[0].shape)],
    )
)
register(
    Prim(
        "getitem_grad",
        lambda s, d, a: (tuple(as_expr(x) for x in a["shape"]), d[0]),
        lambda g, key, shape: _np_zeros_put(g, key, shape),
        lambda ap, op, i, o, g: [ap("getitem", g, key=op.attrs["key"])],
        point_attrs=("shape",),
    )
)


def _np_zeros_put(g, key, shape):
    out = np.zeros(shape, dtype=g.dtype)
    out[key] += g
    return out


def _infer_narrow(shapes, dtypes, attrs):
    shape = list(shapes[0])
    axis = norm_axis(attrs["axis"], len(shape))
    shape[axis] = as_expr(attrs["length"])
    return tuple(shape), dtypes[0]


def _np_narrow(x, axis, start, length):
    idx = [slice(None)] * x.ndim
    idx[axis] = slice(start, start + length)
    return x[tuple(idx)]


register(
    Prim(
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
        point_attrs=("start", "length"),
    )
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


register(
    Prim(
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
        point_attrs=("before", "size"),
    )
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


register(
    Prim(
        "cat",
        _infer_cat,
        lambda *xs, axis: np.concatenate(xs, axis=axis),
        _vjp_cat,
    )
)


def _infer_matmul(shapes, dtypes, attrs):
    a, b = shapes
    if len(a) < 2 or len(b) < 2:
        raise ShapeError(f"matmul needs operands of rank >= 2, got {a} and {b}")
    if a[-1] != b[-2]:
        raise ShapeError(f"matmul: inner sizes differ: {tuple(a)} @ {tuple(b)}")
    batch = broadcast(a[:-2], b[:-2], what="matmul batch dims")
    return batch + (a[-2], b[-1]), promote(*dtypes)


def _swap(ap, x):
    rank = len(x.shape)
    perm = tuple(range(rank - 2)) + (rank - 1, rank - 2)
    return ap("permute", x, perm=perm)


def _vjp_matmul(ap, op, i, o, g):
    a, b = i
    ga = ap("matmul", g, _swap(ap, b))
    gb = ap("matmul", _swap(ap, a), g)
    return [_unbroadcast(ap, ga, a.shape), _unbroadcast(ap, gb, b.shape)]


register(Prim("matmul", _infer_matmul, rowwise.rows_matmul, _vjp_matmul))


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
        gx = ap("index_add", rows(ap("matmul", w, _swap(ap, g))), idx, axis=0, size=size)
        return [gx, None, ap("take_matmul", x, idx, g, trans=False)]
    # out = x[idx] @ w
    gx = ap("index_add", rows(ap("matmul", g, _swap(ap, w))), idx, axis=0, size=size)
    if len(idx.shape) != 1:
        n = 1
        for s in idx.shape:
            n = n * s
        idx = ap("reshape", idx, shape=(n,))
        g = ap("reshape", g, shape=(n, w.shape[1]))
    return [gx, None, ap("take_matmul", x, idx, g, trans=True)]


# x[idx] @ w, or x[idx].T @ w with ``trans`` (each row of x flattened), walking the rows a
# chunk at a time (rowwise.py)
register(Prim("take_matmul", _infer_take_matmul, rowwise.take_matmul, _vjp_take_matmul))


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


register(
    Prim(
        "gather",
        _infer_gather,
        lambda x, idx, axis: np.take_along_axis(x, idx, axis=axis),
        lambda ap, op, i, o, g: [
            ap("scatter_add", g, i[1], axis=op.attrs["axis"], shape=i[0].shape),
            None,
        ],
    )
)
register(
    Prim(
        "scatter_add",
        lambda s, d, a: (tuple(as_expr(x) for x in a["shape"]), d[0]),
        _np_scatter_add,
        lambda ap, op, i, o, g: [ap("gather", g, i[1], axis=op.attrs["axis"]), None],
        point_attrs=("shape",),
    )
)

# --- point-dependent selection (the transpose of temporal slices) ------------------------------


def _infer_select_at(shapes, dtypes, attrs):
    return shapes[0][1:], dtypes[0]


register(
    Prim(
        "select_at",
        _infer_select_at,
        lambda x, index: x[index],
        lambda ap, op, i, o, g: [ap("place_at", g, index=op.attrs["index"], size=i[0].shape[0])],
        point_attrs=("index",),
    )
)


def _np_place_at(x, index, size):
    out = np.zeros((size,) + x.shape, dtype=x.dtype)
    out[index] = x
    return out


register(
    Prim(
        "place_at",
        lambda s, d, a: ((as_expr(a["size"]),) + s[0], d[0]),
        _np_place_at,
        lambda ap, op, i, o, g: [ap("select_at", g, index=op.attrs["index"])],
        point_attrs=("index", "size"),
    )
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


register(
    Prim(
        "diag_gather",
        _declared,
        _np_diag_gather,
        None,
        point_attrs=("first", "shape", "valid"),
        extra={"ragged": True},
    )
)

# --- sources ---------------------------------------------------------------------------------


def _np_full(shape, value, dtype):
    return np.full(shape, value, dtype=dtype)


register(
    Prim(
        "full",
        _declared,
        _np_full,
        None,
        point_attrs=("shape", "value"),
        differentiable=False,
    )
)
register(
    Prim(
        "const",
        lambda s, d, a: (tuple(Const(int(n)) for n in a["value"].shape), a["value"].dtype),
        lambda value: value,
        None,
        array_attrs=("value",),
        differentiable=False,
    )
)


# A draw at least this many times taller than wide is orthonormalised by Cholesky QR
# (``orthogonal_array``); a squarer one, whose condition number Cholesky would square, by
# LAPACK's Householder QR.
CHOLESKY_QR_ASPECT = 4
_SLAB_ROWS = 1024  # rows of the draw multiplied at a time, in place


def orthogonal_array(rows: int, cols: int, gain: float, rng: np.random.Generator) -> np.ndarray:
    """An orthogonal init (well-conditioned at depth; the usual choice for RL policies).

    The orthonormal factor ``Q`` of a standard normal draw ``A = QR`` with ``R``'s diagonal
    positive: unique, so it does not depend on how it is computed. A tall draw (a first
    layer over image observations, 12,288 x 64) is orthonormalised by Cholesky QR in place,
    a slab of rows at a time, twice (the second pass restores orthogonality to rounding):
    its memory is the draw and the result. numpy's Householder QR held about five copies of
    the draw, and the run's resident memory rose 36 MiB at that init (float64, 6 MiB a
    copy): memory-e8's highest point under its 33 MiB budget, before the rollout began.
    """
    n, k = max(rows, cols), min(rows, cols)
    a = rng.standard_normal((n, k))
    if n >= CHOLESKY_QR_ASPECT * k:
        for _ in range(2):
            lower = np.linalg.cholesky(a.T @ a)  # = R^T of the current a
            right = np.linalg.inv(lower).T  # a @ R^-1: the orthonormal factor
            for r in range(0, n, _SLAB_ROWS):
                a[r : r + _SLAB_ROWS] = a[r : r + _SLAB_ROWS] @ right
        q = a
    else:
        q, r = np.linalg.qr(a)
        q *= np.sign(np.diag(r))
    if rows < cols:
        q = q.T
    q = q[:rows, :cols]
    q *= gain
    return q.astype(np.float32)


def _np_orthogonal(shape, dtype, gain, seed):
    rows, cols = (int(n) for n in shape)
    return orthogonal_array(rows, cols, gain, np.random.default_rng(seed)).astype(dtype, copy=False)


# a weight's initial value drawn when the program runs, from its seed: unlike a ``const`` it
# holds no array, so once read (at i == 0) its memory goes back
register(Prim("orthogonal", _declared, _np_orthogonal, None, differentiable=False))


def _np_uniform(shape, dtype, key, batch=()):
    return counter_rng.uniform(np, key, tuple(shape), dtype, batch)


def _np_normal(shape, dtype, key, batch=()):
    return counter_rng.normal(np, key, tuple(shape), dtype, batch)


# Random values are a pure function of (seed, op, point): the same on every backend and in any
# execution order, so random ops can be reordered, vectorised or recomputed like any other.
for _name, _fn in (("uniform", _np_uniform), ("normal", _np_normal)):
    register(
        Prim(
            _name,
            _declared,
            _fn,
            None,
            point_attrs=("shape", "key_at"),
            keyed=True,
            differentiable=False,
        )
    )

# --- user functions and piecewise definitions (run by the executor itself) -------------------

register(Prim("udf", _declared, lambda *xs, fn, **_: fn(*xs), None, differentiable=False))
# pure_call: a pure function of its inputs, given as the object in attr ``fn`` with two faces:
# ``fn(*xs)`` traceable by jax (what the jax backend lowers it to, inside a jitted region or
# loop) and ``fn.host(*xs)``, the same function evaluated on numpy arrays (the reference).
# It returns a tuple of arrays, read through ``tuple_get``. Unlike a ``udf`` it is no host
# call: passes may merge, hoist and reorder it, and a loop around it can be traced.
register(
    Prim(
        "pure_call",
        _declared,
        lambda *xs, fn, **_: fn.host(*xs),
        None,
        differentiable=False,
    )
)
register(
    Prim(
        "tuple_get",
        _declared,
        lambda x, item, **_: x[item],
        None,
        differentiable=False,
    )
)


def _vjp_each(ap, op, i, o, g):
    return [_unbroadcast(ap, g, x.shape) for x in i]


# merge: the value of the first branch whose condition holds (the executor picks it); its
# backward sends the gradient to every branch, and autodiff restricts each to where it won.
register(Prim("merge", _declared, lambda *xs: xs[0], _vjp_each))


def _add_n(*xs: Any, **_: Any) -> Any:
    # one term: a copy, never the input itself, so that a later op may write into the
    # input's buffer (donation) without changing this value
    return sum(xs[1:], xs[0]) if len(xs) > 1 else xs[0].copy()


register(Prim("add_n", _declared, _add_n, _vjp_each))

# --- indexing by tensors, scans, permutations --------------------------------------------------


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


register(
    Prim(
        "take",
        _infer_take,
        lambda x, idx, axis: np.take(x, idx, axis=axis),
        lambda ap, op, i, o, g: [
            ap("index_add", g, i[1], axis=op.attrs["axis"], size=i[0].shape[op.attrs["axis"]]),
            None,
        ],
    )
)


def _infer_index_add(shapes, dtypes, attrs):
    src, idx = shapes
    axis = attrs["axis"]
    return (
        tuple(src[:axis]) + (as_expr(attrs["size"]),) + tuple(src[axis + len(idx) :]),
        dtypes[0],
    )


register(
    Prim(
        "index_add",
        _infer_index_add,
        _np_index_add,
        lambda ap, op, i, o, g: [ap("take", g, i[1], axis=op.attrs["axis"]), None],
        point_attrs=("size",),
    )
)


def _np_cumsum(x, axis, reverse=False):
    if reverse:
        return np.flip(np.cumsum(np.flip(x, axis), axis=axis), axis)
    return np.cumsum(x, axis=axis)


register(
    Prim(
        "cumsum",
        lambda s, d, a: (s[0], d[0]),
        _np_cumsum,
        lambda ap, op, i, o, g: [
            ap("cumsum", g, axis=op.attrs["axis"], reverse=not op.attrs.get("reverse", False))
        ],
    )
)


def _np_linear_scan(a, c, base, reverse=False):
    """``x[t] = a[t] + c[t] * x[t + 1]`` for ``t < T - 1`` and ``x[T - 1] = base``
    (``reverse``), or ``x[t] = a[t] + c[t] * x[t - 1]`` for ``t >= 1`` and ``x[0] = base``: a
    first-order linear recurrence over the leading axis of ``a`` and ``c`` (GAE, discounted
    returns; their row at the base's point is not used). Each row is computed as the
    point-by-point program computes it (a product, then a sum), into one array."""
    steps = len(a)
    out = np.empty((steps, *np.shape(base)), dtype=np.result_type(a, c, base))
    if steps == 0:
        return out
    out[steps - 1 if reverse else 0] = base
    for t in range(steps - 2, -1, -1) if reverse else range(1, steps):
        prev = t + 1 if reverse else t - 1
        row = out[t, ...]  # a view also of a 0-d row
        np.multiply(c[t], out[prev, ...], out=row)
        np.add(a[t], row, out=row)
    return out


register(
    Prim(
        "linear_scan",
        lambda s, d, a: ((s[0][0], *s[2]), d[0]),
        _np_linear_scan,
        differentiable=False,  # made by the compiler (compiler/scan.py), after autodiff
    )
)


register(
    Prim(
        "argsort",
        lambda s, d, a: (s[0], np.dtype("int64")),
        lambda x, axis: np.argsort(x, axis=axis, kind="stable"),
        differentiable=False,
    )
)
register(
    Prim(
        "iota",
        lambda s, d, a: ((as_expr(a["length"]),), np.dtype(a.get("dtype", "int64"))),
        lambda length, dtype="int64": np.arange(length, dtype=dtype),
        point_attrs=("length",),
        differentiable=False,
    )
)


# --- traits ------------------------------------------------------------------------------------


def _declare(names: tuple[str, ...], cost: Callable | None = None, **flags: bool) -> None:
    for name in names:
        prim = REGISTRY[name]
        traits = replace(prim.traits, **flags)
        REGISTRY[name] = replace(prim, traits=traits, cost=cost or prim.cost)


for _p in list(REGISTRY.values()):
    _declare((_p.name,), elementwise=_p.elementwise, random=_p.keyed, fresh=_p.elementwise)
_declare(("sum", "max", "argmax"), reduction=True, cost=lambda o, i, a: float(i[0]))
_declare(("sumsq",), reduction=True, cost=lambda o, i, a: 2.0 * float(i[0]))
_declare(("cumsum",), cost=lambda o, i, a: float(i[0]))
_declare(("argsort",), cost=lambda o, i, a: float(i[0]) * max(np.log2(max(i[0], 2)), 1.0))
# matmul: 2 m n k operations; out = m n (batched), the first input m k
_declare(("matmul",), cost=lambda o, i, a: 2.0 * o * (i[0] * i[1] / max(o, 1)) ** 0.5, fresh=True)
_declare(
    ("take_matmul",),
    cost=lambda o, i, a: 2.0 * (o * i[1] if a.get("trans") else i[1] * i[2]),
    fresh=True,
)
_declare(
    ("reshape", "permute", "expand", "identity", "detach", "select_at", "narrow", "tuple_get"),
    view=True,
    fresh=False,
    shares_input=True,
    cost=lambda o, i, a: 0.0,
)
_declare(("identity", "detach", "reshape"), whole_view="contiguous")
# basic indexing (ints, slices, None, Ellipsis) is a view on numpy and torch, advanced indexing
# a copy: a view where it may be one, though it is no view of its own (it may allocate)
_declare(("getitem",), shares_input=True)
_declare(("udf", "pure_call"), shares_input=True)  # user code may return what it was given
_declare(("permute", "expand"), whole_view="strided")
_declare(("detach",), stops_gradient=True)
_declare(("merge",), piecewise=True, shares_input=True)
_declare(("udf",), host=True)
_declare(("pure_call",), multi_output=True)
_declare(("const", "full", "iota"), constant=True)
_declare(("orthogonal",), fresh=True)
_declare(("linear_scan",), fresh=True, cost=lambda o, i, a: 2.0 * o)
_declare(("expand",), broadcast=True)
