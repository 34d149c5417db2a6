"""Dead-code elimination: a program is exactly the ops its roots need."""

from __future__ import annotations

from timerl.compiler.spec import ProgramSpec
from timerl.ir.graph import walk


def eliminate_dead_code(spec: ProgramSpec) -> ProgramSpec:
    """Keep the ops reachable from the roots (outputs, sinks, side effects)."""
    live = walk(spec.roots)
    if len(live) == len(spec.ops):
        return spec
    return spec.with_ops(live)
