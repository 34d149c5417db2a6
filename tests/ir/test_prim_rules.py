"""The simplification table's rules, each alone on a few hand-built ops: what it rewrites, and
what it declines (a rewrite that could change a value, a shape or a dtype)."""

from __future__ import annotations

import numpy as np
import pytest

from timerl.ir.graph import Edge, Op
from timerl.ir.prims.simplify import (
    GENERIC,
    Lookup,
    constant_value,
    detach_constant,
    fold_constants,
    identities,
    involution,
    no_op_cast,
    unit_rule,
)
from timerl.symbolic import Const, Dim

F32 = np.dtype(np.float32)
t = Dim("t")


def const(value, dtype=F32) -> Op:
    value = np.asarray(value, dtype=dtype)
    return Op(
        "const", (), tuple(Const(n) for n in value.shape), value.dtype, attrs={"value": value}
    )


def over_t(prim: str = "normal", shape=(3,)) -> Op:
    """A value that changes with ``t`` (no constant)."""
    return Op(prim, (t,), tuple(Const(n) for n in shape), F32, attrs={"shape": shape})


def op(prim: str, *srcs: Op, shape=None, dtype=F32, **attrs) -> Op:
    domain = max((s.domain for s in srcs), key=len, default=())
    widest = max(srcs, key=lambda s: len(s.shape))  # broadcasting's result, for these tests
    shape = widest.shape if shape is None else tuple(Const(n) for n in shape)
    inputs = [Edge(s, s.domain) for s in srcs]
    return Op(prim, domain, shape, dtype, inputs=inputs, attrs=attrs)


@pytest.mark.parametrize(
    ("prim", "unit", "sides"),
    [("mul", 1.0, (0, 1)), ("add", 0.0, (0, 1)), ("sub", 0.0, (0,)), ("div", 1.0, (0,))],
)
def test_unit_rule_replaces_an_operation_by_its_unit_with_the_other_operand(prim, unit, sides):
    rule = unit_rule(prim, unit, sides)
    x, one = over_t(), const(unit)
    assert rule(op(prim, x, one), Lookup()) is x
    swapped = rule(op(prim, one, x), Lookup())
    assert (swapped is x) == (1 in sides)  # 1 - x is not x, nor 1 / x
    assert rule(op(prim, x, const(unit + 2.0)), Lookup()) is None


def test_unit_rule_declines_where_the_unit_would_change_the_shape_or_dtype():
    rule = unit_rule("mul", 1.0, (0, 1))
    x = over_t(shape=(3,))
    ones = const(np.ones((2, 3)))  # broadcasting: the product has another shape than x
    assert rule(op("mul", x, ones, shape=(2, 3)), Lookup()) is None
    promoted = op("mul", x, const(1.0, np.float64), dtype=np.dtype(np.float64))
    assert rule(promoted, Lookup()) is None  # float32 * float64 is not x


def test_involution_removes_a_double_negation_only():
    rule = involution("neg")
    x = over_t()
    once = op("neg", x)
    assert rule(op("neg", once), Lookup()) is x
    assert rule(once, Lookup()) is None
    assert rule(op("neg", op("exp", x)), Lookup()) is None


def test_no_op_cast_keeps_an_op_whose_value_differs_from_its_input():
    x = over_t()
    assert no_op_cast(op("cast", x, dtype=F32), Lookup()) is x
    assert no_op_cast(op("cast", x, dtype=np.dtype(np.float64)), Lookup()) is None
    assert no_op_cast(op("reshape", x, shape=(3, 1)), Lookup()) is None
    assert no_op_cast(op("add_n", x, x), Lookup()) is None  # two terms


def test_fold_constants_computes_a_pure_op_of_constants_once():
    folded = fold_constants(op("add", const([1.0, 2.0]), const([3.0, 4.0])), Lookup())
    assert folded is not None and folded.prim == "const"
    np.testing.assert_array_equal(constant_value(folded), [4.0, 6.0])
    assert fold_constants(op("add", over_t(shape=(2,)), const([3.0, 4.0])), Lookup()) is None
    drawn = Op("normal", (), (Const(2),), F32, attrs={"shape": (2,), "dtype": F32})
    assert fold_constants(op("exp", drawn), Lookup()) is None  # a draw is no constant


def test_detach_constant_drops_a_detach_of_what_has_no_gradient():
    c = const([1.0, 2.0])
    assert detach_constant(op("detach", c), Lookup()) is c
    assert detach_constant(op("detach", over_t()), Lookup()) is None


def test_the_table_holds_the_identities_and_the_generic_rules_every_primitive():
    assert fold_constants in GENERIC and detach_constant in GENERIC
    assert [r.__name__ for r in identities("mul")] == ["mul_by_1"]
    assert [r.__name__ for r in identities("neg")] == ["double_neg"]
    assert identities("tanh") == () and identities("not a primitive") == ()
