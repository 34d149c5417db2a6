"""Elementwise primitives: unary and binary arithmetic, comparisons, ``where``, ``cast``, and the
identities (``identity``, ``detach``)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np

import timerl.ir.prims.batching as batching
import timerl.ir.prims.cost as cost
import timerl.ir.prims.rows as rows
from timerl.errors import ProgramError, ShapeError
from timerl.ir import special
from timerl.ir.prims.core import (
    Traits,
    binary,
    bool_same,
    compare,
    float_same,
    same,
    scalar,
    unbroadcast,
)
from timerl.ir.prims.define import define
from timerl.ir.prims.simplify import involution, no_op_cast, unit_rule
from timerl.ir.shapes import broadcast, promote

# an elementwise kernel returns a new array of its own
ELEMENTWISE = Traits(elementwise=True, fresh=True)


def _elementwise(name, infer, np_fn, vjp, simplify=(), **kw):
    """An elementwise primitive: batched, blocked and stacked elementwise."""
    define(
        name,
        infer,
        np_fn,
        vjp,
        traits=kw.pop("traits", ELEMENTWISE),
        cost=kw.pop("cost", cost.per_output),
        batching=batching.ELEMENTWISE,
        rows=kw.pop("rows", rows.ELEMENTWISE),
        simplify=simplify,
        **kw,
    )


def _unary(name, np_fn, vjp=None, infer=float_same, simplify=()):
    _elementwise(name, infer, np_fn, vjp, simplify)


def _binary(name, np_fn, vjp=None, infer=binary, simplify=(), algebra=None):
    traits = replace(ELEMENTWISE, algebra=algebra)
    _elementwise(name, infer, np_fn, vjp, simplify, traits=traits)


# --- unary -------------------------------------------------------------------------------------

_unary("neg", np.negative, lambda ap, op, i, o, g: [ap("neg", g)], same, (involution("neg"),))
_unary("exp", np.exp, lambda ap, op, i, o, g: [ap("mul", g, o)])
_unary("log", np.log, lambda ap, op, i, o, g: [ap("div", g, i[0])])
_unary(
    "tanh",
    np.tanh,
    lambda ap, op, i, o, g: [ap("mul", g, ap("sub", scalar(ap, 1.0, o), ap("mul", o, o)))],
)
_unary(
    "sigmoid",
    lambda x: np.where(
        x >= 0, 1 / (1 + np.exp(-np.abs(x))), 1 - 1 / (1 + np.exp(-np.abs(x)))
    ).astype(x.dtype, copy=False),
    lambda ap, op, i, o, g: [ap("mul", g, ap("mul", o, ap("sub", scalar(ap, 1.0, o), o)))],
)
_unary(
    "sqrt",
    np.sqrt,
    lambda ap, op, i, o, g: [ap("div", g, ap("mul", scalar(ap, 2.0, o), o))],
)
_unary(
    "abs",
    np.abs,
    lambda ap, op, i, o, g: [ap("mul", g, ap("sign", i[0]))],
    same,
)
_unary("sign", np.sign, lambda ap, op, i, o, g: [None], same)
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
_unary("logical_not", np.logical_not, None, bool_same)
_unary("floor", np.floor, lambda ap, op, i, o, g: [None], same)

# --- binary ------------------------------------------------------------------------------------


def _vjp_add(ap, op, i, o, g):
    return [unbroadcast(ap, g, i[0].shape), unbroadcast(ap, g, i[1].shape)]


def _vjp_sub(ap, op, i, o, g):
    return [unbroadcast(ap, g, i[0].shape), unbroadcast(ap, ap("neg", g), i[1].shape)]


def _vjp_mul(ap, op, i, o, g):
    return [
        unbroadcast(ap, ap("mul", g, i[1]), i[0].shape),
        unbroadcast(ap, ap("mul", g, i[0]), i[1].shape),
    ]


def _vjp_div(ap, op, i, o, g):
    ga = ap("div", g, i[1])
    gb = ap("neg", ap("div", ap("mul", g, o), i[1]))
    return [unbroadcast(ap, ga, i[0].shape), unbroadcast(ap, gb, i[1].shape)]


def _vjp_pow(ap, op, i, o, g):
    a, b = i
    ga = ap("mul", g, ap("mul", b, ap("pow", a, ap("sub", b, scalar(ap, 1.0, b)))))
    safe = ap("where", ap("gt", a, scalar(ap, 0.0, a)), a, scalar(ap, 1.0, a))
    gb = ap("mul", g, ap("mul", o, ap("log", safe)))
    return [unbroadcast(ap, ga, a.shape), unbroadcast(ap, gb, b.shape)]


def _vjp_extremum(cmp: str):
    def rule(ap, op, i, o, g):
        pick = ap(cmp, i[0], i[1])
        zero = scalar(ap, 0.0, g)
        return [
            unbroadcast(ap, ap("where", pick, g, zero), i[0].shape),
            unbroadcast(ap, ap("where", pick, zero, g), i[1].shape),
        ]

    return rule


def _np_div(a, b):
    out = np.divide(a, b)  # a fresh array: ``astype`` copies only where the dtype differs
    return (
        out.astype(np.result_type(a, b), copy=False)
        if np.issubdtype(np.result_type(a, b), np.floating)
        else out
    )


# identities: x + 0, 0 + x, x - 0, x * 1, 1 * x, x / 1 and x ** 1 are x
_binary("add", np.add, _vjp_add, simplify=(unit_rule("add", 0.0, (0, 1)),), algebra="add")
_binary("sub", np.subtract, _vjp_sub, simplify=(unit_rule("sub", 0.0, (0,)),))
_binary("mul", np.multiply, _vjp_mul, simplify=(unit_rule("mul", 1.0, (0, 1)),), algebra="mul")
_binary(
    "div",
    _np_div,
    _vjp_div,
    lambda s, d, a: (broadcast(*s), np.result_type(promote(*d), np.float32)),
    (unit_rule("div", 1.0, (0,)),),
)
_binary("pow", np.power, _vjp_pow, simplify=(unit_rule("pow", 1.0, (0,)),))
_binary("floordiv", np.floor_divide)
_binary("mod", np.mod)
_binary("maximum", np.maximum, _vjp_extremum("ge"))
_binary("minimum", np.minimum, _vjp_extremum("le"))
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
    _binary(_name, _np, None, compare)

# --- where, cast, identities -------------------------------------------------------------------


def _infer_where(shapes, dtypes, attrs):
    if dtypes[0] != np.dtype(bool):
        raise ShapeError(f"where: the condition must be bool, got {dtypes[0]}")
    return broadcast(*shapes, what="where operands"), promote(dtypes[1], dtypes[2])


def _vjp_where(ap, op, i, o, g):
    zero = scalar(ap, 0.0, g)
    return [
        None,
        unbroadcast(ap, ap("where", i[0], g, zero), i[1].shape),
        unbroadcast(ap, ap("where", i[0], zero, g), i[2].shape),
    ]


_elementwise(
    "where",
    _infer_where,
    lambda c, a, b: np.where(c, a, b).astype(np.result_type(a, b), copy=False),
    _vjp_where,
)


def _infer_cast(shapes, dtypes, attrs):
    return shapes[0], np.dtype(attrs["dtype"])


_elementwise(
    "cast",
    _infer_cast,
    lambda x, dtype: np.asarray(x).astype(dtype),
    lambda ap, op, i, o, g: (
        [ap("cast", g, dtype=i[0].dtype)] if np.issubdtype(i[0].dtype, np.floating) else [None]
    ),
    (no_op_cast,),  # a cast to the dtype it has
)

# the input itself: a view of its whole buffer that costs nothing, that keeps rows read on
# demand such rows
_SAME_BUFFER = Traits(
    elementwise=True, view=True, shares_input=True, whole_view="contiguous", same_value=True
)
_SAME_ROWS = replace(rows.ELEMENTWISE, row_view=rows.keeps_rows)
_elementwise(
    "identity",
    same,
    lambda x: x,
    lambda ap, op, i, o, g: [g],
    (no_op_cast,),
    traits=_SAME_BUFFER,
    rows=_SAME_ROWS,
    cost=cost.free,
)
_elementwise(
    "detach",
    same,
    lambda x: x,
    None,
    (no_op_cast,),  # gradients are built before compiling: a detach is its input
    traits=replace(_SAME_BUFFER, stops_gradient=True),
    rows=_SAME_ROWS,
    cost=cost.free,
    differentiable=False,
)
