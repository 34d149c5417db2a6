"""Duplicate code elimination: ops that compute the same value at every point become one.

Programs built from library pieces repeat work: PPO's actor and critic each flatten the same
observations (and their weight gradients each transpose that copy), a loss and its gradient
rebuild the same ratio. Two ops are duplicates when they apply the same pure primitive, with
the same attributes, over the same domain, to the same inputs read at the same indices under
the same conditions. Hash-consing in creation order finds them, reading each input through
the representative found so far; recurrences (cycles through piecewise ops) can hide a
duplicate until its inputs are merged, so the pass repeats until nothing changes.

The pass returns a redirect table (duplicate id -> representative); the pipeline copies the
graph through it, so the user's graph is never rewritten.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from timerl.compiler.spec import ProgramSpec
from timerl.ir import prims
from timerl.ir.graph import Op, copy_graph, walk

MAX_PASSES = 10


def _resolve(op: Op, rep: dict[int, Op]) -> Op:
    while op.id in rep:
        op = rep[op.id]
    return op


def _key(op: Op, rep: dict[int, Op]) -> tuple[Any, ...] | None:
    """What the op computes, as a hashable value; None when it must stay a distinct op."""
    traits = prims.get(op.prim).traits
    if op.effect or not traits.mergeable:
        return None
    key = (
        op.prim,
        op.domain,
        tuple(op.shape),
        op.dtype,
        tuple(sorted(op.attrs.items())),
        tuple((_resolve(e.src, rep).id, tuple(e.index), e.cond) for e in op.inputs),
    )
    try:
        hash(key)
    except TypeError:  # e.g. a constant's numpy value: not worth comparing
        return None
    return key


def find_duplicates(ops: list[Op], roots: Iterable[Op]) -> dict[int, Op]:
    """Map each duplicate op's id to the op that replaces it (roots are never replaced)."""
    keep = {r.id for r in roots}
    rep: dict[int, Op] = {}
    for _ in range(MAX_PASSES):
        table: dict[tuple[Any, ...], Op] = {}
        found = 0
        for op in ops:  # creation order: an op's inputs are usually seen before it
            if op.id in keep or op.id in rep:
                continue
            key = _key(op, rep)
            if key is None:
                continue
            first = table.setdefault(key, op)
            if first is not op:
                rep[op.id] = first
                found += 1
        if not found:
            break
    return rep


def merge_duplicates(spec: ProgramSpec) -> ProgramSpec:
    """The program with each duplicate replaced by its representative."""
    rep = find_duplicates(list(spec.ops), spec.roots)
    if not rep:
        return spec
    return spec.with_ops(walk(spec.with_ops(copy_graph(spec.ops, redirect=rep)).roots))
