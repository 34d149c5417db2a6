"""Algebraic simplification: constant folding and identities, as small local rules.

The rules live beside each primitive (``ir/prims/simplify.py``: the rules that hold for any
primitive, and each primitive's own identities as its entry in the simplification table). This
module is the engine: it applies the rules in creation order, so a rewrite is seen by the op's
readers in the same sweep, and then copies the graph through the replacements; nothing else is
changed. A rule that cannot show the replacement has the same value, shape and dtype at every
point declines: a rewrite never changes results.
"""

from __future__ import annotations

from timerl.compiler.spec import ProgramSpec
from timerl.ir.graph import Op, copy_graph, walk
from timerl.ir.prims.linalg import matmul_of_gather
from timerl.ir.prims.simplify import (
    FOLD_LIMIT,
    GENERIC,
    Lookup,
    Rule,
    constant_value,
    identities,
)

__all__ = [
    "FOLD_LIMIT",
    "GENERIC",
    "Lookup",
    "Rule",
    "constant_value",
    "matmul_of_gather",
    "simplify",
]


def simplify(spec: ProgramSpec) -> ProgramSpec:
    """The program with the rules applied in one sweep (roots keep their own op)."""
    roots = {r.id for r in spec.roots}
    lookup = Lookup()
    known = {op.id for op in spec.ops}
    created: dict[int, Op] = {}
    for op in spec.ops:  # creation order: inputs before readers, except around recurrences
        if op.id in roots:
            continue
        for rule in GENERIC + identities(op.prim):
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
