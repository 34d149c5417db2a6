"""Shrink a failing generated program to a small one that fails the same way.

Greedy and structural: drop tensors nothing reads, replace an expression by one of its
operands or a number, turn max/min/mean reductions into sums, drop branches, lower the bounds and
drop gradients, keeping each step only if the program is still valid (the reference evaluates
it) and still fails with the same signature. Used by ``survey.py`` for the reproducers it writes.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable, Iterator

import numpy as np
from exprs import Const, Expr, Read
from programs import Program

Step = Callable[[Program], Program | None]


def _nodes(e: Expr, path: tuple = ()) -> Iterator[tuple[tuple, Expr]]:
    yield path, e
    for f in dataclasses.fields(e):
        child = getattr(e, f.name)
        if isinstance(child, Expr):
            yield from _nodes(child, (*path, f.name))


def _replace_at(e: Expr, path: tuple, new: Expr) -> Expr:
    if not path:
        return new
    child = getattr(e, path[0])
    return dataclasses.replace(e, **{path[0]: _replace_at(child, path[1:], new)})


def _slots(p: Program) -> list[tuple[int, int | None]]:
    """(tensor index, branch index or None for a derived tensor's expression)."""
    out: list[tuple[int, int | None]] = []
    for k, t in enumerate(p.tensors):
        if t.kind == "derived":
            out.append((k, None))
        out += [(k, b) for b in range(len(t.branches))]
    return out


def _get(p: Program, slot: tuple[int, int | None]) -> Expr:
    t = p.tensors[slot[0]]
    return t.expr if slot[1] is None else t.branches[slot[1]][1]


def _set(p: Program, slot: tuple[int, int | None], e: Expr) -> bool:
    t = p.tensors[slot[0]]
    if slot[1] is None:
        if e.dims != t.expr.dims or e.shape != t.expr.shape:
            return False  # readers index the tensor by its domain and shape
        t.expr = e
    else:
        if e.shape != t.branches[slot[1]][1].shape:
            return False
        where, _ = t.branches[slot[1]]
        t.branches[slot[1]] = (where, e)
    return True


def _readers(p: Program) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {t.name: set() for t in p.tensors}
    for t in p.tensors:
        exprs = ([t.expr] if t.expr is not None else []) + [e for _, e in t.branches]
        for e in exprs:
            for name in e.leaves():
                out[name].add(t.name)
    return out


def _relink(p: Program) -> Program:
    """Point every read at the program's own tensor objects (after a deep copy or a drop)."""
    by_name = {t.name: t for t in p.tensors}
    for t in p.tensors:
        slots = [(t.expr, None)] if t.expr is not None else []
        slots += [(e, b) for b, (_, e) in enumerate(t.branches)]
        for e, b in slots:
            for _, node in _nodes(e):
                if isinstance(node, Read):
                    node.src = by_name[node.src.name]
            if b is None:
                t.expr = e
    return p


def candidates(p: Program) -> Iterator[Program]:
    """Smaller variants of ``p``, most aggressive first (not all of them valid)."""
    readers = _readers(p)
    # drop a tensor (with its coupled partners) that no other tensor reads
    for t in p.tensors:
        group = {g.name for g in p.tensors if g.name == t.name or (g.group and g.group == t.name)}
        if t.group:
            continue
        outside = set().union(*(readers[g] for g in group)) - group
        if outside:
            continue
        q = copy.deepcopy(p)
        q.tensors = [g for g in q.tensors if g.name not in group]
        q.sinks = tuple(name for name in q.sinks if name not in group)
        if q.outputs:
            yield _relink(q)
    # drop the sinks, the dynamic end of t
    if p.sinks:
        yield dataclasses.replace(copy.deepcopy(p), sinks=())
    if p.until is not None:
        yield dataclasses.replace(copy.deepcopy(p), until=None, lengths=None)
    if p.lengths is not None:
        yield dataclasses.replace(copy.deepcopy(p), lengths=None)
    # drop a non-final branch (of a recurrence too: the reference says whether that is valid)
    for k, t in enumerate(p.tensors):
        if t.branches:
            for b in range(len(t.branches) - 1):
                q = copy.deepcopy(p)
                del q.tensors[k].branches[b]
                yield q
    # a branch's value replaced by a number (the write broadcasts it)
    for k, t in enumerate(p.tensors):
        for b, (where, e) in enumerate(t.branches):
            if not isinstance(e, Const):
                q = copy.deepcopy(p)
                q.tensors[k].branches[b] = (where, Const(0.5))
                yield _relink(q)
    # replace an expression node by an operand of the same shape; sums for other reductions
    for slot in _slots(p):
        for path, node in _nodes(_get(p, slot)):
            options: list[Expr] = []
            for f in dataclasses.fields(node):
                child = getattr(node, f.name)
                if isinstance(child, Expr) and child.shape == node.shape:
                    options.append(child)
            if isinstance(node, Read) and node.nslices and node.reduce != "sum":
                options.append(dataclasses.replace(node, reduce="sum"))
            for option in options:
                q = copy.deepcopy(p)
                new = _replace_at(_get(q, slot), path, copy.deepcopy(option))
                if _set(q, slot, new):
                    yield _relink(q)
    # lower a bound
    for d in p.dims:
        if p.n[d] > 1 and not (d == "t" and p.lengths is not None and min(p.lengths) < 2):
            q = copy.deepcopy(p)
            q.n = dict(p.n)
            q.n[d] -= 1
            if q.lengths is not None:  # each episode one point shorter, or one episode fewer
                q.lengths = tuple(n - 1 for n in q.lengths) if d == "t" else q.lengths[: q.n["i"]]
            for t in q.inputs:
                for axis, e in enumerate(t.domain):
                    if e == d:
                        index = [slice(None)] * t.array.ndim
                        index[axis] = slice(0, q.n[d])
                        t.array = np.ascontiguousarray(t.array[tuple(index)])
            yield _relink(q)
    if p.grad:
        q = copy.deepcopy(p)
        q.grad = False
        yield q


def valid(p: Program) -> bool:
    """The reference evaluates every point without reading outside a domain."""
    try:
        p.reference_values()
        if p.grad:
            p.reference_grads()
    except Exception:
        return False
    return True


def shrink(p: Program, same_failure: Callable[[Program], bool], budget: int = 200) -> Program:
    """The smallest variant of ``p`` found within ``budget`` checks that still fails alike."""
    tries = 0
    improved = True
    while improved and tries < budget:
        improved = False
        for q in candidates(p):
            if tries >= budget:
                break
            if not valid(q):
                continue
            tries += 1
            if same_failure(q):
                p = q
                improved = True
                break
    return p
