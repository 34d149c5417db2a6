"""Dead-code elimination: a program is exactly the ops its roots need."""

from __future__ import annotations

from collections.abc import Iterable

from timerl.ir.graph import Op, walk


def live_ops(roots: Iterable[Op]) -> list[Op]:
    """Ops reachable from the roots (outputs, sinks, side effects); everything else is dead."""
    return walk(roots)
