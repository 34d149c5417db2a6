"""Duplicate code elimination: ops that compute the same value at every point become one.

Programs built from library pieces repeat work: PPO's actor and critic each flatten the same
observations (and their weight gradients each transpose that copy), a loss and its gradient
rebuild the same ratio. Two ops are duplicates when they apply the same pure primitive, with
the same attributes, over the same domain, to the same inputs read at the same indices under
the same conditions. Hash-consing in creation order finds them; readers of a duplicate are
redirected to the first op, and dead-code elimination then drops the duplicate. Recurrences
(cycles through piecewise ops) can hide a duplicate until its inputs are merged, so the pass
repeats until nothing changes.

Edges are rewritten in place: the program stays equivalent, and rebuilding the graph for every
compile would cost more than the pass saves.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from timerl.ir import prims
from timerl.ir.graph import Edge, Op

MAX_PASSES = 10
# Never merged: state (piecewise ops are the program's tensors), impure or random ops.
_NEVER = {"merge", "udf"}


def _key(op: Op) -> tuple[Any, ...] | None:
    """What the op computes, as a hashable value; None when it must stay a distinct op."""
    if op.effect or op.prim in _NEVER or prims.get(op.prim).keyed:
        return None
    key = (
        op.prim,
        op.domain,
        tuple(op.shape),
        op.dtype,
        tuple(sorted(op.attrs.items())),
        tuple((e.src.id, tuple(e.index), e.cond) for e in op.inputs),
    )
    try:
        hash(key)
    except TypeError:  # e.g. a constant's numpy value: not worth comparing
        return None
    return key


def merge_duplicates(ops: list[Op], roots: Iterable[Op]) -> int:
    """Redirect readers of duplicate ops to one representative; return how many were merged."""
    keep = {r.id for r in roots}
    merged = 0
    for _ in range(MAX_PASSES):
        table: dict[tuple[Any, ...], Op] = {}
        rep: dict[int, Op] = {}
        for op in ops:  # creation order: an op's inputs are usually seen before it
            if any(e.src.id in rep for e in op.inputs):
                op.inputs = [Edge(rep.get(e.src.id, e.src), e.index, e.cond) for e in op.inputs]
            if op.id in keep:
                continue
            key = _key(op)
            if key is None:
                continue
            first = table.setdefault(key, op)
            if first is not op:
                rep[op.id] = first
        if not rep:
            break
        merged += len(rep)
        ops = [op for op in ops if op.id not in rep]
    return merged
