"""Domain conditions: compute each op only at the points some reader needs.

A branch of a piecewise definition (``ret[True] = r + g * ret[t + 1]`` after
``ret[t.eq(T - 1)] = r``) is only read where it wins, so its ops must not run elsewhere — at
``t = T - 1`` they would read past the end. An op's guard is the set of its points
some reader needs (``timerl.ir.reads.needed_points``).
"""

from __future__ import annotations

from timerl.compiler.spec import ProgramSpec
from timerl.ir.graph import copy_graph
from timerl.ir.reads import needed_points
from timerl.symbolic import TRUE


def add_guards(spec: ProgramSpec) -> ProgramSpec:
    """A copy of the graph whose ops carry their guard (TRUE: all points; effects run
    everywhere)."""
    needed = needed_points(list(spec.ops), spec.roots)
    guards = {op.id: needed[op.id] if op.effect is False else TRUE for op in spec.ops}
    return spec.with_ops(copy_graph(spec.ops, guards=guards))
