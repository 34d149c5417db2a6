"""Domain conditions: compute each op only at the points some reader needs.

A branch of a piecewise definition (``ret[True] = r + g * ret[t + 1]`` after
``ret[t.eq(T - 1)] = r``) is only read where it wins, so its ops must not run elsewhere — at
``t = T - 1`` they would read past the end. An op's guard is the set of its points
some reader needs (``timerl.ir.reads.needed_points``).
"""

from __future__ import annotations

from collections.abc import Iterable

from timerl.ir.graph import Op
from timerl.ir.reads import needed_points
from timerl.symbolic import TRUE


def infer_guards(ops: list[Op], roots: Iterable[Op]) -> None:
    """Set ``op.guard`` on every op (TRUE: all points of its domain); effects run everywhere."""
    needed = needed_points(ops, roots)
    for op in ops:
        op.guard = needed[op.id] if op.effect is False else TRUE
