"""Loop-invariant hoisting: an op computes once over the dims its value depends on.

An op's domain is where it is computed; the loops of the schedule run it at every point of
it. A pure op whose inputs, attributes and shape do not mention a dim ``d`` has the same value
at every ``d`` (``full(value=i)`` depends on ``i``; ``full(value=0.5)`` inside the update loop
does not), so ``d`` leaves its domain and the op moves out of that loop: the scheduler places
it where its remaining dims allow. Readers keep reading it, with the index for ``d`` dropped.

Declined: effects and host calls (each point is an event), random ops (their key is the
point), piecewise ops (the program's tensors), and ops read through a slice along ``d`` (a
gather of identical copies would then need an explicit broadcast).
"""

from __future__ import annotations

from collections.abc import Mapping

from timerl.compiler.ragged import varies_along
from timerl.compiler.spec import ProgramSpec
from timerl.ir import prims
from timerl.ir.graph import Op, consumers, copy_graph
from timerl.symbolic import Bound, Dim, Expr, Slice


def _uses(
    op: Op, domains: dict[int, tuple[Dim, ...]], ragged: Mapping[Bound, frozenset[Dim]]
) -> set[Dim]:
    """Dims of the op's own domain that its value depends on (a length that ``until`` sets
    per point of other dims depends on those)."""
    used = varies_along(op, ragged)
    for e in op.inputs:
        src_domain = domains.get(e.src.id, e.src.domain)
        for d, idx in zip(e.src.domain, e.index, strict=True):
            if d in src_domain:
                used.update(s for s in idx.symbols() if isinstance(s, Dim))
        used.update(s for s in e.cond.symbols() if isinstance(s, Dim))
    for value in op.attrs.values():
        for item in value if isinstance(value, (tuple, list)) else (value,):
            if isinstance(item, Expr):
                used.update(s for s in item.symbols() if isinstance(s, Dim))
    for s in op.shape:
        used.update(x for x in s.symbols() if isinstance(x, Dim))
    return used & set(op.domain)


def _movable(op: Op) -> bool:
    traits = prims.get(op.prim).traits
    return not (op.effect or traits.host or traits.random or traits.piecewise)


def hoist_invariants(spec: ProgramSpec) -> ProgramSpec:
    """The program with each pure op's domain cut to the dims its value depends on."""
    roots = {r.id for r in spec.roots}
    readers = consumers(spec.ops)
    ragged = spec.ragged
    domains: dict[int, tuple[Dim, ...]] = {}
    work = [op for op in reversed(spec.ops) if op.id not in roots and _movable(op)]
    queued = {op.id for op in work}
    while work:  # an op's readers may become invariant once it is hoisted
        op = work.pop()
        queued.discard(op.id)
        current = domains.get(op.id, op.domain)
        keep = tuple(d for d in current if d in _uses(op, domains, ragged))
        if keep == current:
            continue
        gone = set(current) - set(keep)
        sliced = any(
            isinstance(idx, Slice)
            for _, e in readers[op.id]
            for d, idx in zip(op.domain, e.index, strict=True)
            if d in gone
        )
        if sliced:
            continue
        domains[op.id] = keep
        for reader, _ in readers[op.id]:
            if reader.id not in queued and reader.id not in roots and _movable(reader):
                work.append(reader)
                queued.add(reader.id)
    if not domains:
        return spec
    return spec.with_ops(copy_graph(spec.ops, domains=domains))
