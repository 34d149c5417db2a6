"""Compile-time checks that every point a program reads is defined and in range.

The check is exact for the bounds being compiled: each op's domain is enumerated as numpy
arrays of points (vectorised, so a 10^6-point domain costs milliseconds) and every edge's
index expressions are evaluated over it. Domains larger than ``MAX_POINTS`` (8 million) are
checked at scaled-down bounds, which exercises the same affine relations but can miss a
branch that only applies at large constant offsets.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from timerl.errors import BoundError, OutOfRangeError, ProgramError, UndefinedPointError
from timerl.ir import prims
from timerl.ir.graph import Edge, Op
from timerl.ir.grid import domain_grid as _grid
from timerl.symbolic import FALSE, TRUE, Bound, Condition, Dim, Expr, Slice, vevaluate


def _runs(values: np.ndarray) -> str:
    """``0, 2..4, 7``: sorted distinct ints as runs (the first few)."""
    values = np.unique(values)
    runs: list[str] = []
    start = prev = int(values[0])
    for v in [int(x) for x in values[1:]] + [None]:
        if v is not None and v == prev + 1:
            prev = v
            continue
        runs.append(str(start) if start == prev else f"{start}..{prev}")
        if v is not None:
            start = prev = v
    return ", ".join(runs[:6]) + (", ..." if len(runs) > 6 else "")


def _where(mask: np.ndarray, op: Op, env: dict) -> str:
    """A readable description of the points where ``mask`` holds."""
    if not op.domain:
        return "(the single point)"
    if len(op.domain) == 1:
        d = op.domain[0]
        values = np.broadcast_to(env[d], mask.shape)[mask]
        lo, hi = int(values.min()), int(values.max())
        if lo == hi:
            return f"{d.name}={lo}"
        if np.unique(values).size == hi - lo + 1:
            return f"{d.name} in [{lo}, {hi}]"
        return f"{d.name} in {{{_runs(values)}}}"
    parts = []
    for d in op.domain:
        values = np.broadcast_to(env[d], mask.shape)[mask]
        lo, hi = int(values.min()), int(values.max())
        parts.append(f"{d.name}={lo}" if lo == hi else f"{d.name} in [{lo}, {hi}]")
    return ", ".join(parts)


def _as_mask(value: object, n: int) -> np.ndarray:
    return np.broadcast_to(np.asarray(value, dtype=bool), (n,))


def exclusive_conditions(op: Op) -> list[Condition]:
    """Where each branch of a piecewise op applies: first matching branch wins."""
    taken: Condition = FALSE
    out = []
    for e in op.inputs:
        out.append(e.cond & ~taken)
        taken = taken | e.cond
    return out


def edge_conditions(op: Op) -> list[Condition]:
    """Where each input edge of ``op`` is read: a piecewise op's branches exclusively."""
    if prims.get(op.prim).traits.piecewise:
        return exclusive_conditions(op)
    return [e.cond for e in op.inputs]


def check_bounds(ops: list[Op], bounds: Mapping[Bound, int]) -> None:
    for op in ops:
        for d in op.domain:
            if d.bound not in bounds:
                raise BoundError(
                    f"bound {d.bound.name} of dim {d.name} (used by {op.where()}) has no value: "
                    f"pass bounds={{{d.bound.name}: ...}} to compile, or end {d.name} with "
                    "ctx.until"
                )
            if bounds[d.bound] < 1:
                raise BoundError(f"bound {d.bound.name} must be >= 1, got {bounds[d.bound]}")


def validate(ops: list[Op], bounds: Mapping[Bound, int]) -> None:
    """Raise a ProgramError subclass naming the tensor, index and points of the first fault."""
    check_bounds(ops, bounds)
    readers: dict[int, list[tuple[Op, Edge]]] = {}  # named only in an error
    for op in ops:
        for e in op.inputs:
            readers.setdefault(e.src.id, []).append((op, e))
    grids: dict[tuple[Dim, ...], dict] = {}  # read only: the ops of one domain share its grid
    for op in ops:
        env = grids.get(op.domain)
        if env is None:
            env = grids[op.domain] = _grid(op.domain, bounds)
        n = len(env[op.domain[0]]) if op.domain else 1
        conds = [e.cond for e in op.inputs]
        if prims.get(op.prim).traits.piecewise:
            if not op.inputs:
                raise UndefinedPointError(
                    f"{op.where()} is declared but never defined: assign it, e.g. x[0] = ..."
                )
            covered = ~_as_mask(vevaluate(op.guard, env), n)
            for c in conds:
                covered |= _as_mask(vevaluate(c, env), n)
            if not covered.all():
                who = [f"{r.where()} reads {e}" for r, e in readers.get(op.id, [])[:3]]
                raise UndefinedPointError(
                    f"{op.where()} is undefined at {_where(~covered, op, env)}: no branch of its "
                    "definition applies there"
                    + (f"; needed because {'; '.join(who)}" if who else "")
                )
            conds = exclusive_conditions(op)
        guard = _as_mask(vevaluate(op.guard, env), n)
        for edge, cond in zip(op.inputs, conds, strict=True):
            active = guard & _as_mask(vevaluate(cond, env), n)
            if active.any():
                _check_edge(op, edge, active, env, bounds, n)


def _check_edge(op: Op, edge: Edge, active: np.ndarray, env: dict, bounds, n: int) -> None:
    src = edge.src
    for d, idx in zip(src.domain, edge.index, strict=True):
        extent = env.get(d.bound, bounds[d.bound]) if d in op.domain else bounds[d.bound]
        if isinstance(idx, Slice):
            start = np.broadcast_to(vevaluate(idx.start, env), (n,))
            stop = np.broadcast_to(vevaluate(idx.stop, env), (n,))
            bad_size = active & (stop < start)
            if bad_size.any():
                raise OutOfRangeError(
                    f"{op.where()} reads {src.label}[{idx}] with a negative-size slice on "
                    f"{d.name} at {_where(bad_size, op, env)}"
                )
            nonempty = active & (stop > start)
            lo, hi = start, stop - 1
            active_here = nonempty
        else:
            assert isinstance(idx, Expr)
            lo = hi = np.broadcast_to(vevaluate(idx, env), (n,))
            active_here = active
        bad = active_here & ((lo < 0) | (hi > extent - 1))
        if bad.any():
            raise OutOfRangeError(
                f"{op.where()} reads {src.label} at {d.name}={idx}, outside 0..{d.bound.name}-1 "
                f"(= {extent - 1}), at {_where(bad, op, env)}"
            )


def reads_within_guards(ops: list[Op], bounds: Mapping[Bound, int], srcs: set[int]) -> bool:
    """Whether every point read of an op in ``srcs`` lies inside that op's guard.

    Guards are needed points, a superset of the points read by construction, except where
    ``timerl.ir.reads`` capped them by the computable points: this confirms those on the
    actual bounds. A slice read of a capped op that is not computed everywhere is not
    checked point by point; it answers False.
    """
    for op in ops:
        edges = [
            (e, c)
            for e, c in zip(op.inputs, edge_conditions(op), strict=True)
            if e.src.id in srcs and e.src.guard != TRUE
        ]
        if not edges:
            continue
        env = _grid(op.domain, bounds)
        n = len(env[op.domain[0]]) if op.domain else 1
        guard = _as_mask(vevaluate(op.guard, env), n)
        for edge, cond in edges:
            active = guard & _as_mask(vevaluate(cond, env), n)
            if not active.any():
                continue
            if any(isinstance(idx, Slice) for idx in edge.index):
                return False
            at = dict(env)
            for d, idx in zip(edge.src.domain, edge.index, strict=True):
                at[d] = np.broadcast_to(vevaluate(idx, env), (n,))
            if not _as_mask(vevaluate(edge.src.guard, at), n)[active].all():
                return False
    return True


def check_not_empty(ops: list[Op]) -> None:
    if not ops:
        raise ProgramError("the program computes nothing: no sink, output or side effect")
