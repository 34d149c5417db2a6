"""The simplification table: each primitive's algebraic identities, as small local rules
(tinygrad's pattern rules) that ``compiler/simplify.py`` applies in one sweep.

A rule looks at one op and its inputs and answers "replace this op's value by that op's" (or
by a new op, such as a folded constant), or declines (None). A rule that cannot show the
replacement has the same value, shape and dtype at every point declines: a rewrite never
changes results. ``GENERIC`` rules hold for every primitive (they ask traits); each
primitive's own identities are its entry in ``TABLE`` (``()``: none of its own), beside its
definition. Each rule is tested alone (``tests/ir/test_prim_rules.py``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from timerl.ir.graph import Edge, Op
from timerl.ir.prims.core import HIDDEN_ATTRS, get
from timerl.ir.prims.table import RuleTable
from timerl.symbolic import TRUE, Const, Expr

FOLD_LIMIT = 1 << 16  # elements: larger constants are cheaper to compute than to keep


class Lookup:
    """What rules may ask: an op's current replacement, and a constant op's value."""

    def __init__(self) -> None:
        self.replaced: dict[int, Op] = {}
        self._values: dict[int, np.ndarray | None] = {}

    def __call__(self, op: Op) -> Op:
        while op.id in self.replaced:
            op = self.replaced[op.id]
        return op

    def value(self, op: Op) -> np.ndarray | None:
        if op.id not in self._values:
            self._values[op.id] = constant_value(op)
        return self._values[op.id]


Rule = Callable[[Op, Lookup], "Op | None"]

TABLE: RuleTable[tuple[Rule, ...]] = RuleTable(
    "simplify", "a tuple of identities (() for none) (compiler/simplify.py)"
)


def identities(prim: str) -> tuple[Rule, ...]:
    """The primitive's own identities (none where it has none)."""
    return TABLE.rule(prim) or ()


# --- what rules share --------------------------------------------------------------------------


def _static(value: Any) -> bool:
    """True for an attribute that is the same at every point."""
    if isinstance(value, Expr):
        return isinstance(value, Const)
    if isinstance(value, (tuple, list)):
        return all(_static(v) for v in value)
    return True


def _plain(value: Any) -> Any:
    if isinstance(value, Const):
        return value.value
    if isinstance(value, (tuple, list)):
        return type(value)(_plain(v) for v in value)
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value


def constant_value(op: Op) -> np.ndarray | None:
    """The value of a constant op that is the same at every point, or None."""
    if not get(op.prim).traits.constant or op.domain or op.inputs:
        return None
    attrs = {k: v for k, v in op.attrs.items() if k not in HIDDEN_ATTRS}
    if not all(_static(v) for v in attrs.values()):
        return None
    value = np.asarray(get(op.prim).impl(**_plain(attrs)))
    return value if value.size <= FOLD_LIMIT else None


def _const_op(value: np.ndarray, like: Op) -> Op:
    value = np.array(value, dtype=like.dtype)
    return Op(
        prim="const",
        domain=(),
        shape=tuple(Const(int(n)) for n in value.shape),
        dtype=value.dtype,
        attrs={"value": value},
        name=like.name,
        site=like.site,
    )


def is_identity(edge: Edge) -> bool:
    """The edge reads its source at the reader's own point, unconditionally."""
    return edge.cond == TRUE and all(
        i is d for i, d in zip(edge.index, edge.src.domain, strict=True)
    )


def _same_value_as(op: Op, src: Op) -> bool:
    """Readers of ``op`` may read ``src`` instead: same domain, shape and dtype."""
    return src.domain == op.domain and tuple(src.shape) == tuple(op.shape) and src.dtype == op.dtype


def operand(op: Op, k: int, lookup: Lookup) -> Op | None:
    """Input ``k`` when it is read at the op's own point with the op's value shape/dtype."""
    e = op.inputs[k]
    src = lookup(e.src)
    return src if is_identity(e) and _same_value_as(op, src) else None


def _is_scalar(op: Op, number: float, lookup: Lookup) -> bool:
    value = lookup.value(op)
    return value is not None and value.size >= 1 and bool(np.all(value == number))


# --- rules for every primitive -----------------------------------------------------------------


def fold_constants(op: Op, lookup: Lookup) -> Op | None:
    """A pure op whose inputs are all constants is computed once, at compile time."""
    traits = get(op.prim).traits
    if op.effect or traits.constant or not traits.mergeable or op.domain or not op.inputs:
        return None
    if not all(is_identity(e) for e in op.inputs):
        return None
    values = [lookup.value(lookup(e.src)) for e in op.inputs]
    if any(v is None for v in values):
        return None
    attrs = {k: v for k, v in op.attrs.items() if k not in HIDDEN_ATTRS}
    if not all(_static(v) for v in attrs.values()):
        return None
    out = get(op.prim).impl(*values, **_plain(attrs))
    if isinstance(out, tuple):
        return None
    out = np.asarray(out)
    if out.size > FOLD_LIMIT or out.shape != tuple(int(s.value) for s in op.shape):
        return None
    return _const_op(out, op)


def detach_constant(op: Op, lookup: Lookup) -> Op | None:
    """Detaching a constant (or something already detached) changes nothing."""
    if not get(op.prim).traits.stops_gradient or len(op.inputs) != 1:
        return None
    src = lookup(op.inputs[0].src)
    if not (get(src.prim).traits.constant or get(src.prim).traits.stops_gradient):
        return None
    return operand(op, 0, lookup)


GENERIC: tuple[Rule, ...] = (fold_constants, detach_constant)

# --- identities primitives share ---------------------------------------------------------------


def unit_rule(prim: str, unit: float, sides: tuple[int, ...]) -> Rule:
    """``x op unit`` (and ``unit op x`` for the listed sides) is ``x``."""

    def rule(op: Op, lookup: Lookup) -> Op | None:
        if len(op.inputs) != 2:
            return None
        for k in sides:
            other = lookup(op.inputs[1 - k].src)
            if _is_scalar(other, unit, lookup):
                x = operand(op, k, lookup)
                if x is not None:
                    return x
        return None

    rule.__name__ = f"{prim}_by_{unit:g}"
    return rule


def involution(prim: str) -> Rule:
    """``f(f(x))`` is ``x`` (negation)."""

    def rule(op: Op, lookup: Lookup) -> Op | None:
        if len(op.inputs) != 1 or not is_identity(op.inputs[0]):
            return None
        inner = lookup(op.inputs[0].src)
        if inner.prim != prim or len(inner.inputs) != 1:
            return None
        return operand(inner, 0, lookup) if _same_value_as(op, inner) else None

    rule.__name__ = f"double_{prim}"
    return rule


def no_op_cast(op: Op, lookup: Lookup) -> Op | None:
    """A cast, reshape, identity or one-input ``add_n`` (a gradient with one contribution)
    whose result equals its input is its input: the meter would count it twice."""
    if len(op.inputs) != 1:
        return None
    return operand(op, 0, lookup)
