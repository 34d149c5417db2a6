"""Structure: piecewise definitions (``merge``), sums of gradient contributions (``add_n``),
user functions (``udf``: a host call; ``pure_call``: a pure, traceable function) and the parts
of their tuples (``tuple_get``)."""

from __future__ import annotations

from typing import Any

from timerl.ir.prims.core import Traits, declared, free, unbroadcast
from timerl.ir.prims.define import define

# user code may return what it was given
define(
    "udf",
    declared,
    lambda *xs, fn, **_: fn(*xs),
    traits=Traits(host=True, shares_input=True),
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
    differentiable=False,
)
define(
    "tuple_get",
    declared,
    lambda x, item, **_: x[item],
    traits=Traits(view=True, shares_input=True),
    cost=free,
    differentiable=False,
)


def _vjp_each(ap, op, i, o, g):
    return [unbroadcast(ap, g, x.shape) for x in i]


# merge: the value of the first branch whose condition holds (the executor picks it); its
# backward sends the gradient to every branch, and autodiff restricts each to where it won.
define(
    "merge",
    declared,
    lambda *xs: xs[0],
    _vjp_each,
    traits=Traits(piecewise=True, shares_input=True),
)


def _add_n(*xs: Any, **_: Any) -> Any:
    # one term: a copy, never the input itself, so that a later op may write into the
    # input's buffer (donation) without changing this value
    return sum(xs[1:], xs[0]) if len(xs) > 1 else xs[0].copy()


define("add_n", declared, _add_n, _vjp_each)
