"""Which points of each op are read, as conditions over the op's own dims.

An op's needed points are the union, over its readers, of the points they read it at under
their own needed points and the edge's condition: exact for same-point reads, shifts and fixed
points, every point for anything else. Solved as a fixed point, since recurrences make the
graph cyclic. Guard inference uses it to compute ops only where they are read; autodiff to let
a VJP contribute only where the forward value was read.

Where an op's needs outgrow what a guard can say (comparisons on two linear forms that do not
fold), they are capped by the points where the op can be computed at all (every read in
range, through the ops it reads up to a piecewise one) instead of becoming every point, where
it would read out of range. In a valid program every needed point is computable, so the cap
keeps them all; ``NeededPoints.capped`` names the capped ops for the compiler to confirm
that on the actual bounds.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Iterable
from dataclasses import dataclass

from timerl.ir import prims
from timerl.ir.graph import Op
from timerl.ir.validate import edge_conditions
from timerl.symbolic import FALSE, TRUE, Condition, Const, Dim, Expr, Slice, simplify
from timerl.symbolic.bounds import union
from timerl.symbolic.expr import And, Cmp, Literal, Not, Or, Symbol, comparisons

MAX_ROUNDS = 100
WIDEN_AFTER = 6
# Guards are kept as simplified but not normalised And/Or trees; past this many comparisons a
# guard stops paying for itself (and unions around cycles can grow it without end): widen it.
MAX_ATOMS = 24


def _atoms(cond: Condition) -> int:
    parts = getattr(cond, "parts", None)
    if parts is not None:
        return sum(_atoms(p) for p in parts)
    part = getattr(cond, "part", None)
    return _atoms(part) if part is not None else 1


# --- guards on one linear form, as intervals ----------------------------------------------------
# Around a recurrence the needed points of a gradient chain grow one shift per round
# (``t + 2 == T``, then ``t + 3 == T``, ...): as And/Or trees they never converge, and widening
# them to every point computes ops where they read out of range. When every comparison is about
# one linear form ``L`` (``t - T``), the guard is a set of integers for ``L``: it is rewritten
# as its intervals, and widened by moving an end that keeps moving to infinity.

Intervals = list[tuple[float, float]]


def _form_of(cond: Condition) -> tuple[dict, Intervals] | None:
    """``(terms of L, the values of L where cond holds)``, if cond is about one form ``L``."""
    cmps = comparisons(cond)
    if not cmps:
        return None
    base, _ = cmps[0].diff.linear()
    if not all(isinstance(a, Symbol) for a in base):
        return None
    neg = {a: -k for a, k in base.items()}
    sign: dict[int, tuple[int, int]] = {}  # id(cmp) -> (s, c): diff = s * L + c
    for c in cmps:
        terms, const = c.diff.linear()
        if terms != base and terms != neg:
            return None
        sign[id(c)] = (1 if terms == base else -1, const)
    points = [-s * k for s, k in sign.values()]
    lo, hi = min(points) - 1, max(points) + 1

    def holds(c: Condition, v: int) -> bool:
        if isinstance(c, Literal):
            return c.value
        if isinstance(c, Cmp):
            s, k = sign[id(c)]
            d = s * v + k
            return {"==": d == 0, "!=": d != 0, "<": d < 0, "<=": d <= 0}[c.op]
        if isinstance(c, And):
            return all(holds(p, v) for p in c.parts)
        if isinstance(c, Or):
            return any(holds(p, v) for p in c.parts)
        assert isinstance(c, Not)
        return not holds(c.part, v)

    out: Intervals = []
    start: float | None = None
    for v in range(lo, hi + 1):  # below lo and above hi every comparison is as at lo, hi
        if holds(cond, v) and start is None:
            start = -math.inf if v == lo else v
        if not holds(cond, v) and start is not None:
            out.append((start, v - 1))
            start = None
    if start is not None:
        out.append((start, math.inf))
    return base, out


def _from_intervals(terms: dict, spans: Intervals) -> Condition:
    form = sum((a * k for a, k in terms.items()), Const(0))
    parts: list[Condition] = []
    for a, b in spans:
        if a == b:
            parts.append(form.eq(int(a)))
            continue
        part: Condition = TRUE
        if a != -math.inf:
            part = part & (form >= int(a))
        if b != math.inf:
            part = part & (form <= int(b))
        parts.append(part)
    return simplify(Or.make(parts)) if parts else FALSE


def _compact(cond: Condition) -> Condition:
    """``cond`` as intervals of its one linear form, when it has one and that is smaller."""
    found = _form_of(cond)
    if found is None:
        return cond
    out = _from_intervals(*found)
    return out if _atoms(out) < _atoms(cond) else cond


def _widen(old: Condition, new: Condition) -> Condition:
    """A superset of ``new`` whose ends that moved since ``old`` go to infinity (else TRUE)."""
    a, b = _form_of(old), _form_of(new)
    if a is None or b is None or a[0] != b[0] or not a[1] or not b[1]:
        return TRUE
    (_, was), (terms, now) = a, b
    now = list(now)
    if now[0][0] < was[0][0]:
        now[0] = (-math.inf, now[0][1])
    if now[-1][1] > was[-1][1]:
        now[-1] = (now[-1][0], math.inf)
    return _from_intervals(terms, now)


def conjuncts(cond: Condition) -> list[Condition]:
    """``cond`` as a list of conditions that all hold: And flattened, and a negated Or as the
    negations of its parts (a branch's exclusive condition is ``~(c1 | c2)``)."""
    if isinstance(cond, And):
        return [c for p in cond.parts for c in conjuncts(p)]
    if isinstance(cond, Not) and isinstance(cond.part, Or):
        return [c for p in cond.part.parts for c in conjuncts(~p)]
    if isinstance(cond, Not) and isinstance(cond.part, Not):
        return conjuncts(cond.part.part)
    return [cond]


def read_points(
    reader: Op,
    edge_index: tuple,
    src: Op,
    cond: Condition,
    exists: bool = False,
) -> Condition:
    """The points of ``src`` that ``reader`` reads where ``cond`` holds at its own point.

    Exact for shifts (``t``, ``t - 1``: move the condition by the shift) and fixed points
    (``x[0]``, ``x[T - 1]``); a slice reads every point of its dim (the condition's parts
    about that dim are dropped, those about the other dims kept: a block loop's values read
    whole, ``x[t, 0:K]``, only where the reader runs); anything else (reads that mix dims)
    reads every point.
    """
    moved: dict[Dim, Expr] = {}
    pins: list[Condition] = []
    for d, idx in zip(src.domain, edge_index, strict=True):
        if isinstance(idx, Slice):
            continue
        if not isinstance(idx, Expr):
            return TRUE
        dims = {s for s in idx.symbols() if isinstance(s, Dim)}
        if not dims:
            pins.append(d.eq(idx))
            continue
        diff = idx - d
        if dims != {d} or d not in reader.domain or not isinstance(diff, Const):
            return TRUE
        moved[d] = d - diff.value
    out = cond.substitute(moved) if moved else cond
    unmapped = {s for s in out.symbols() if isinstance(s, Dim) and s not in moved}
    if unmapped:
        # The reader's condition is also about dims the read does not map: keep the parts
        # of it that are not (a superset of the points read, so still sound), and with
        # ``exists``, of each unmapped dim the condition that a point of it meets the rest
        # (a branch at ``t == 1`` reads nothing where ``T == 1``).
        parts = conjuncts(out)
        out = TRUE
        for part in parts:
            if not any(s in unmapped for s in part.symbols()):
                out = out & part
        if exists:
            for d in unmapped:
                out = out & _some_point(d, parts, unmapped)
    for d, back in moved.items():
        if back is not d:
            out = out & (back >= 0) & (back < d.bound)
    for p in pins:
        out = out & p
    return simplify(out)


def _some_point(d: Dim, parts: list[Condition], unmapped: set[Dim]) -> Condition:
    """Where some point of ``d`` in ``[0, D)`` meets the parts that bound it: those of
    ``parts`` that compare ``d`` alone, linearly, with an expression free of unmapped dims
    (``t == 1``, ``t + 2 <= T``). The other parts are left out, so the condition may hold
    where no point meets them all (a superset, as a guard may be)."""
    lows: list[Expr] = [Const(0)]
    highs: list[Expr] = [d.bound - 1]
    for part in parts:
        if not isinstance(part, Cmp) or part.op == "!=" or d not in part.symbols():
            continue
        terms, _ = part.diff.linear()
        coef = terms.get(d)
        rest = part.diff - d * coef if coef in (1, -1) else None
        if rest is None or any(s in unmapped for s in rest.symbols()):
            continue
        edge = -rest if coef == 1 else rest  # d OP edge (coef 1) or edge OP d (coef -1)
        strict = 1 if part.op == "<" else 0
        if part.op == "==" or coef == 1:
            highs.append(edge - strict)
        if part.op == "==" or coef == -1:
            lows.append(edge + strict)
    out: Condition = TRUE
    for lo in lows:
        for hi in highs:
            out = out & (lo <= hi)
    return out


@dataclass(frozen=True)
class NeededPoints:
    """Each op's needed points (op id -> condition), and the ops whose needs were capped by
    their computable points (sound for valid programs only: see the module docstring)."""

    guards: dict[int, Condition]
    capped: frozenset[int] = frozenset()

    def __getitem__(self, op_id: int) -> Condition:
        return self.guards[op_id]


def needed_points(
    ops: list[Op],
    roots: Iterable[Op],
    cap: bool = True,
    exists: bool = False,
) -> NeededPoints:
    """The points of each op that ``roots`` (read everywhere) need, transitively.

    ``exists``: a point read only by readers whose condition fixes a dim it lacks (a branch
    at ``t == 1``) is needed only where that dim has such a point (``T >= 2``), a condition on
    the bounds; without it, at every point. Autodiff asks for it, so that a branch with no
    point contributes no gradient: the compiler drops it once the bounds are known
    (``compiler/branches.py``), with what only it reads. Guards do not: the compiler's
    storage and fusion decisions are made for unguarded ops.

    ``cap=False`` makes a guard that outgrows its size every point instead of the op's
    computable points: the reading the compiler falls back to when a cap does not hold.
    """
    roots = list(roots)
    guard: dict[int, Condition] = {op.id: FALSE for op in ops}
    for r in roots:
        guard[r.id] = TRUE
    reads: dict[int, list] = {op.id: [] for op in ops}
    for reader in ops:
        for edge, cond in zip(reader.inputs, edge_conditions(reader), strict=True):
            reads[edge.src.id].append((reader, edge, cond))
    root_ids = {r.id for r in roots}
    by_id = {op.id: op for op in ops}
    # A worklist: an op is revisited only when one of its readers' needs changed. Readers
    # mostly have larger ids than what they read, so popping the largest id first carries a
    # change down a whole chain in one go.
    heap = [-op.id for op in ops if op.id not in root_ids]
    heapq.heapify(heap)
    pending = {-k for k in heap}
    changes = {op.id: 0 for op in ops}
    budget = MAX_ROUNDS * len(ops)
    seen: dict[tuple[int, Condition], Condition] = {}  # read_points of unchanged readers
    computable: dict[int, Condition] | None = None  # computed on the first cap
    capped: set[int] = set()
    while heap:
        budget -= 1
        if budget < 0:
            return NeededPoints({op.id: TRUE for op in ops})
        op = by_id[-heapq.heappop(heap)]
        pending.discard(op.id)
        if guard[op.id] == TRUE or op.id in capped:
            continue
        g: Condition = FALSE
        for reader, edge, cond in reads[op.id]:
            if guard[reader.id] == FALSE:
                continue
            key = (id(edge), guard[reader.id])
            part = seen.get(key)
            if part is None:
                part = seen[key] = read_points(
                    reader, edge.index, op, guard[reader.id] & cond, exists
                )
            g = union(g, part)  # absorbs disjuncts one another implies
            if _atoms(g) > MAX_ATOMS:
                g = _compact(g)  # rather than every point, where it is about one form
                if _atoms(g) > MAX_ATOMS:
                    g = TRUE
                    if cap and not prims.get(op.prim).traits.piecewise:
                        if computable is None:
                            computable = computable_points(ops)
                        g = computable[op.id]
                        capped.add(op.id)
                    break
            if g == TRUE:
                break
        if g == guard[op.id]:
            continue
        changes[op.id] += 1
        # Every cycle passes through a piecewise op; one whose guard keeps changing follows
        # a shift around the cycle: widen it, first by sending the moving ends of its
        # intervals to infinity (``t <= T - 2``), then, if it still changes, to every point.
        if prims.get(op.prim).traits.piecewise and changes[op.id] > WIDEN_AFTER:
            old = guard[op.id]
            g = _widen(old, union(old, g)) if changes[op.id] <= 2 * WIDEN_AFTER else TRUE
            if g == old:
                continue
        guard[op.id] = g
        for e in op.inputs:
            src = e.src.id
            if src not in pending and src not in root_ids:
                pending.add(src)
                heapq.heappush(heap, -src)
    return NeededPoints(guard, frozenset(capped))


def computable_points(ops: list[Op]) -> dict[int, Condition]:
    """Op id -> a superset of the points where the op can be computed.

    A non-piecewise op can be computed where each of its reads is in range and each op it
    reads (up to a piecewise one, which picks a branch per point and so bounds nothing here)
    can be computed at the points read. Reads through a slice keep only their own range.
    Every cycle of the graph passes through a piecewise op, so the ops below are a DAG.
    """
    by_id = {op.id: op for op in ops}
    out: dict[int, Condition] = {}
    opened: set[int] = set()  # a cycle without a piecewise op (none should exist) reads TRUE
    for start in ops:
        stack = [(start, False)]
        while stack:
            op, expanded = stack.pop()
            if op.id in out:
                continue
            if prims.get(op.prim).traits.piecewise:
                out[op.id] = TRUE
                continue
            if not expanded:
                opened.add(op.id)
                stack.append((op, True))
                stack.extend(
                    (e.src, False)
                    for e in op.inputs
                    if e.src.id in by_id and e.src.id not in out and e.src.id not in opened
                )
                continue
            out[op.id] = _computable_here(op, out)
    return out


def _computable_here(op: Op, known: dict[int, Condition]) -> Condition:
    """Where ``op``'s own reads are in range and its sources computable at the points read."""
    cond: Condition = TRUE
    for e in op.inputs:
        in_range: Condition = TRUE
        moved: dict[Dim, Expr] = {}
        for d, idx in zip(e.src.domain, e.index, strict=True):
            if isinstance(idx, Slice):
                empty = idx.stop <= idx.start
                in_range = in_range & (empty | ((idx.start >= 0) & (idx.stop <= d.bound)))
            else:
                in_range = in_range & (idx >= 0) & (idx < d.bound)
                moved[d] = idx
        src = known.get(e.src.id, TRUE)
        if src != TRUE and len(moved) == len(e.src.domain):
            in_range = in_range & src.substitute(moved)
        cond = cond & (~e.cond | in_range)
    out = simplify(cond)
    return out if _atoms(out) <= 4 * MAX_ATOMS else TRUE
