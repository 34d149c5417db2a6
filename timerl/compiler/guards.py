"""Domain conditions: compute each op only at the points some reader needs.

A branch of a piecewise definition (``ret[True] = r + g * ret[t + 1]`` after
``ret[t.eq(T - 1)] = r``) is only read where it wins, so its ops must not run elsewhere — at
``t = T - 1`` they would read past the end. An op's guard is the set of its points
some reader needs (``timerl.ir.reads.needed_points``). Where those needs were capped by the
points an op can be computed at, the cap is confirmed on the bounds being compiled; if it
does not hold (an invalid program), the guards are inferred again without caps, and
validation names the read that fails.
"""

from __future__ import annotations

from timerl.compiler.spec import ProgramSpec
from timerl.ir.graph import copy_graph
from timerl.ir.reads import needed_points
from timerl.ir.validate import reads_within_guards
from timerl.symbolic import Condition


def add_guards(spec: ProgramSpec) -> ProgramSpec:
    """A copy of the graph whose ops carry their guard (TRUE: all points; effects run
    everywhere)."""
    # An effect runs at every point (each is an event), also one that only a value asked
    # of ``tl.evaluate`` reaches, which does not make it a root: what it reads is needed at
    # every point too, or it would read points nobody computed (an env step at the last t
    # whose next observation no one reads).
    roots = [*spec.roots, *(op for op in spec.ops if op.effect)]
    needed = needed_points(list(spec.ops), roots)
    out = _guarded(spec, needed.guards)
    if needed.capped and not reads_within_guards(
        list(out.ops), spec.check_bounds, set(needed.capped)
    ):
        out = _guarded(spec, needed_points(list(spec.ops), roots, cap=False).guards)
    return out


def _guarded(spec: ProgramSpec, needed: dict[int, Condition]) -> ProgramSpec:
    return spec.with_ops(copy_graph(spec.ops, guards={op.id: needed[op.id] for op in spec.ops}))
