"""Structure: piecewise definitions (``merge``), sums of gradient contributions (``add_n``),
user functions (``udf``: a host call; ``pure_call``: a pure, traceable function) and the parts
of their tuples (``tuple_get``)."""

from __future__ import annotations

from typing import Any

import timerl.ir.prims.batching as batching
import timerl.ir.prims.cost as cost
import timerl.ir.prims.rows as rows
from timerl.ir.prims.batching import Batch, Batched, Batching, Decline, point_rank
from timerl.ir.prims.core import Traits, declared, unbroadcast
from timerl.ir.prims.define import define
from timerl.ir.prims.rows import Rows
from timerl.ir.prims.simplify import no_op_cast
from timerl.ir.prims.table import Declined
from timerl.symbolic import TRUE, Const

_USER_CODE = Declined("user code: nothing is known of how its value follows its inputs")

# user code may return what it was given
define(
    "udf",
    declared,
    lambda *xs, fn, **_: fn(*xs),
    traits=Traits(host=True, shares_input=True),
    cost=cost.per_output,
    batching=Declined("a host call runs at each point, in order"),
    rows=_USER_CODE,
    simplify=(),
    differentiable=False,
)
# pure_call: a pure function of its inputs, given as the object in attr ``fn`` with two faces:
# ``fn(*xs)`` traceable by jax (what the jax backend lowers it to, inside a jitted region or
# loop) and ``fn.host(*xs)``, the same function evaluated on numpy arrays (the reference).
# It returns a tuple of arrays, read through ``tuple_get``. Unlike a ``udf`` it is no host
# call: passes may merge, hoist and reorder it, and a loop around it can be traced.
define(
    "pure_call",
    declared,
    lambda *xs, fn, **_: fn.host(*xs),
    traits=Traits(multi_output=True, shares_input=True),
    cost=cost.per_output,
    batching=_USER_CODE,
    rows=_USER_CODE,
    simplify=(),
    differentiable=False,
)
define(
    "tuple_get",
    declared,
    lambda x, item, **_: x[item],
    traits=Traits(view=True, shares_input=True, tuple_part=True),
    cost=cost.free,
    batching=Declined("a part of a user function's tuple, which is not batched"),
    rows=_USER_CODE,
    simplify=(),
    differentiable=False,
)


def _vjp_each(ap, op, i, o, g):
    return [unbroadcast(ap, g, x.shape) for x in i]


def _batch_merge_one(b: Batch) -> Batched:
    """A piecewise definition with one unconditional branch is that branch, broadcast (one
    with several branches is batched by ``compiler/vectorize.py`` as its runs)."""
    if len(b.op.inputs) != 1 or b.op.inputs[0].cond != TRUE:
        raise Decline("it is a piecewise definition")
    if b.op.inputs[0].src.dtype != b.op.dtype:
        raise Decline("its branch has another dtype")
    shape = (Const(b.size), *b.op.shape)
    return Batched("expand", {"shape": shape}, operand_rank=point_rank(b))


# merge: the value of the first branch whose condition holds (the executor picks it); its
# backward sends the gradient to every branch, and autodiff restricts each to where it won.
define(
    "merge",
    declared,
    lambda *xs: xs[0],
    _vjp_each,
    traits=Traits(piecewise=True, shares_input=True),
    cost=cost.per_output,
    batching=Batching(_batch_merge_one),
    rows=Rows(blocks=rows.elementwise_blocks),
    simplify=(),
)


def _add_n(*xs: Any, **_: Any) -> Any:
    # one term: a copy, never the input itself, so that a later op may write into the
    # input's buffer (donation) without changing this value
    return sum(xs[1:], xs[0]) if len(xs) > 1 else xs[0].copy()


define(
    "add_n",
    declared,
    _add_n,
    _vjp_each,
    cost=cost.per_output,
    batching=batching.ELEMENTWISE,
    rows=Rows(blocks=rows.elementwise_blocks),
    simplify=(no_op_cast,),  # one term: its value is the term's
)
