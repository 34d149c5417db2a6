"""What of an op is evaluated at each point: its per-point attributes and a random op's key.

The executors evaluate them at each point (``runtime/calls.py``) and the fusion pass asks
whether they can be traced (``compiler/fusion_loops.py``): one definition for both.
"""

from __future__ import annotations

from typing import Any

from timerl.ir import prims
from timerl.ir.graph import Op


def point_attrs(op: Op) -> tuple[tuple[str, Any], ...]:
    """``(name, value)`` of the attributes evaluated at each point: an index expression, a
    literal, or a tuple of those (a random op's ``key_at`` is its key's, not an attribute)."""
    rule = prims.get(op.prim)
    return tuple(
        (name, op.attrs[name])
        for name in rule.point_attrs
        if name in op.attrs and not (rule.traits.random and name == "key_at")
    )


def key_coordinates(op: Op) -> tuple[Any, ...] | None:
    """The coordinates that complete a random op's key at a point (its domain unless it says
    otherwise); None for an op that draws nothing."""
    if not prims.get(op.prim).traits.random:
        return None
    coords = op.attrs.get("key_at")
    return tuple(op.domain) if coords is None else tuple(coords)


def key_stream(op: Op) -> int:
    """A random op's stream number, fixed when the op is built: rebuilding a program (to
    resume from a checkpoint) draws the same numbers at the same points."""
    return op.attrs.get("stream", op.id)
