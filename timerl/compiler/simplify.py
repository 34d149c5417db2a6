"""Algebraic simplification: constant folding and identities, as small local rules.

Each rule looks at one op and its inputs and either answers "replace this op's value by that
op's" or "by this constant", or declines. The engine (``simplify``) applies the rules in
creation order, so a rewrite is seen by the op's readers in the same sweep, and then copies
the graph through the replacements; nothing else is changed. A rule that cannot show the
replacement has the same value, shape and dtype at every point declines: a rewrite never
changes results.

Rules are tinygrad-style pattern functions (``Rule = Callable[[Op, Lookup], Op | None]``),
each tested alone in ``tests/compiler/test_simplify.py``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from timerl.compiler.spec import ProgramSpec
from timerl.ir import prims, rowwise
from timerl.ir.graph import Edge, Op, copy_graph, walk
from timerl.symbolic import TRUE, Const, Expr, Slice

FOLD_LIMIT = 1 << 16  # elements: larger constants are cheaper to compute than to keep
_HIDDEN = {"stream", "adopt_domain", "pass_point"}


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
    if not prims.get(op.prim).traits.constant or op.domain or op.inputs:
        return None
    attrs = {k: v for k, v in op.attrs.items() if k not in _HIDDEN}
    if not all(_static(v) for v in attrs.values()):
        return None
    value = np.asarray(prims.get(op.prim).impl(**_plain(attrs)))
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


def _is_identity(edge: Edge) -> bool:
    return edge.cond == TRUE and all(
        i is d for i, d in zip(edge.index, edge.src.domain, strict=True)
    )


def _same_value_as(op: Op, src: Op) -> bool:
    """Readers of ``op`` may read ``src`` instead: same domain, shape and dtype."""
    return src.domain == op.domain and tuple(src.shape) == tuple(op.shape) and src.dtype == op.dtype


# --- rules -------------------------------------------------------------------------------------


def fold_constants(op: Op, lookup: Lookup) -> Op | None:
    """A pure op whose inputs are all constants is computed once, at compile time."""
    traits = prims.get(op.prim).traits
    if op.effect or traits.constant or not traits.mergeable or op.domain or not op.inputs:
        return None
    if not all(_is_identity(e) for e in op.inputs):
        return None
    values = [lookup.value(lookup(e.src)) for e in op.inputs]
    if any(v is None for v in values):
        return None
    attrs = {k: v for k, v in op.attrs.items() if k not in _HIDDEN}
    if not all(_static(v) for v in attrs.values()):
        return None
    out = prims.get(op.prim).impl(*values, **_plain(attrs))
    if isinstance(out, tuple):
        return None
    out = np.asarray(out)
    if out.size > FOLD_LIMIT or out.shape != tuple(int(s.value) for s in op.shape):
        return None
    return _const_op(out, op)


def _is_scalar(op: Op, number: float, lookup: Lookup) -> bool:
    value = lookup.value(op)
    return value is not None and value.size >= 1 and bool(np.all(value == number))


def _operand(op: Op, k: int, lookup: Lookup) -> Op | None:
    """Input ``k`` when it is read at the op's own point with the op's value shape/dtype."""
    e = op.inputs[k]
    src = lookup(e.src)
    return src if _is_identity(e) and _same_value_as(op, src) else None


def _unit_rule(prim: str, unit: float, sides: tuple[int, ...]) -> Rule:
    """``x op unit`` (and ``unit op x`` for the listed sides) is ``x``."""

    def rule(op: Op, lookup: Lookup) -> Op | None:
        if len(op.inputs) != 2:
            return None
        for k in sides:
            other = lookup(op.inputs[1 - k].src)
            if _is_scalar(other, unit, lookup):
                x = _operand(op, k, lookup)
                if x is not None:
                    return x
        return None

    rule.__name__ = f"{prim}_by_{unit:g}"
    return rule


def _involution(prim: str) -> Rule:
    """``f(f(x))`` is ``x`` (negation)."""

    def rule(op: Op, lookup: Lookup) -> Op | None:
        if len(op.inputs) != 1 or not _is_identity(op.inputs[0]):
            return None
        inner = lookup(op.inputs[0].src)
        if inner.prim != prim or len(inner.inputs) != 1:
            return None
        return _operand(inner, 0, lookup) if _same_value_as(op, inner) else None

    rule.__name__ = f"double_{prim}"
    return rule


def no_op_cast(op: Op, lookup: Lookup) -> Op | None:
    """A cast, reshape, identity or one-input ``add_n`` (a gradient with one contribution)
    whose result equals its input is its input: the meter would count it twice."""
    if len(op.inputs) != 1:
        return None
    return _operand(op, 0, lookup)


def detach_constant(op: Op, lookup: Lookup) -> Op | None:
    """Detaching a constant (or something already detached) changes nothing."""
    if not prims.get(op.prim).traits.stops_gradient or len(op.inputs) != 1:
        return None
    src = lookup(op.inputs[0].src)
    if not (prims.get(src.prim).traits.constant or prims.get(src.prim).traits.stops_gradient):
        return None
    return _operand(op, 0, lookup)


def _point_read(edge: Edge) -> bool:
    """The edge reads one point (no slice): its value has its source's shape."""
    return edge.cond == TRUE and not any(isinstance(i, Slice) for i in edge.index)


def matmul_of_gather(op: Op, lookup: Lookup) -> Op | None:
    """``take(x, idx) @ w`` is ``take_matmul(x, idx, w)`` and ``take(x, idx).T @ g`` is
    ``take_matmul(x, idx, g, trans=True)`` (a weight's gradient), also with the gathered rows
    flattened by a reshape in between: the product walks the rows in chunks, so the
    gathered minibatch is never built.

    Only for a gather larger than one chunk: below that, the gather is built once and shared
    by every product reading it (PPO's actor, critic and their weight gradients), where each
    take_matmul would gather its rows again."""
    if len(op.inputs) != 2 or not _is_identity(op.inputs[0]) or op.inputs[1].cond != TRUE:
        return None
    a = lookup(op.inputs[0].src)
    trans = False
    if a.prim == "permute" and tuple(a.attrs.get("perm", ())) == (1, 0):
        if not _is_identity(a.inputs[0]):
            return None
        a, trans = lookup(a.inputs[0].src), True
    if a.prim == "reshape" and len(a.shape) == 2 and _is_identity(a.inputs[0]):
        # the gathered rows flattened (a policy's input layer): take_matmul flattens rows
        inner = lookup(a.inputs[0].src)
        if inner.prim != "take" or not inner.shape or inner.shape[0] != a.shape[0]:
            return None
        a = inner
    if a.prim != "take" or len(op.shape) != 2 or a.attrs.get("axis", 0) != 0:
        return None
    if not all(isinstance(s, Const) for s in a.shape):
        return None
    gathered = int(np.prod([s.value for s in a.shape], dtype=np.int64)) * a.dtype.itemsize
    if gathered <= rowwise.CHUNK_BYTES:
        return None
    x_edge, idx_edge = a.inputs
    if not (_point_read(x_edge) and _point_read(idx_edge)):
        return None
    x, idx = lookup(x_edge.src), lookup(idx_edge.src)
    if len(x.shape) < 2 or len(idx.shape) != 1:
        return None
    if x.dtype != op.dtype:
        return None
    return Op(
        prim="take_matmul",
        domain=op.domain,
        shape=op.shape,
        dtype=op.dtype,
        inputs=[x_edge, idx_edge, op.inputs[1]],
        attrs={"trans": trans},
        name=op.name,
        site=op.site,
    )


# Rules that hold for any primitive (they ask traits), then each primitive's own identities
# (a rule table keyed by primitive, as each JAX transformation keeps its own).
GENERIC_RULES: tuple[Rule, ...] = (fold_constants, detach_constant)
RULES: dict[str, tuple[Rule, ...]] = {
    "mul": (_unit_rule("mul", 1.0, (0, 1)),),
    "div": (_unit_rule("div", 1.0, (0,)),),
    "add": (_unit_rule("add", 0.0, (0, 1)),),
    "sub": (_unit_rule("sub", 0.0, (0,)),),
    "pow": (_unit_rule("pow", 1.0, (0,)),),
    "neg": (_involution("neg"),),
    "matmul": (matmul_of_gather,),
    "cast": (no_op_cast,),
    "reshape": (no_op_cast,),
    "identity": (no_op_cast,),
    "detach": (no_op_cast,),
    "add_n": (no_op_cast,),
}


def simplify(spec: ProgramSpec) -> ProgramSpec:
    """The program with the rules applied in one sweep (roots keep their own op)."""
    roots = {r.id for r in spec.roots}
    lookup = Lookup()
    known = {op.id for op in spec.ops}
    created: dict[int, Op] = {}
    for op in spec.ops:  # creation order: inputs before readers, except around recurrences
        if op.id in roots:
            continue
        for rule in GENERIC_RULES + RULES.get(op.prim, ()):
            new = rule(op, lookup)
            if new is not None:
                lookup.replaced[op.id] = new
                if new.id not in known:  # a folded constant or a fused op: a new op
                    created[new.id] = new
                break
    if not lookup.replaced:
        return spec
    copied = copy_graph(list(spec.ops) + list(created.values()), redirect=lookup.replaced)
    return spec.with_ops(walk(spec.with_ops(copied).roots))
