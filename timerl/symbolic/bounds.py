"""Exact sign facts about index expressions over the whole iteration space.

The region is the product over dims ``d`` of ``{0 <= d <= D - 1, D >= 1}`` (``D`` its bound). For
an affine form in dims and bounds that region is a cone with apex ``d = 0, D = 1`` and rays
``(0, 1)`` and ``(1, 1)`` per pair, so ``sup`` is finite iff the form does not grow along any ray
and is then its value at the apex. That one check, exact and symbolic, is all the scheduler's
dependence-direction analysis needs; min/max are handled by choosing arms, mod by its range.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field

from timerl.symbolic.expr import (
    FALSE,
    TRUE,
    And,
    Bound,
    Cmp,
    Condition,
    Const,
    Dim,
    DivMod,
    Expr,
    MinMax,
    Not,
    Or,
    Symbol,
    _sort_key,
)


def _linear_le0(terms: dict[Expr, int], const: int) -> bool:
    for atom, coef in terms.items():
        if isinstance(atom, MinMax):
            rest = {a: c for a, c in terms.items() if a is not atom}
            # An upper bound of coef*min(args) is coef*arg for any arg (coef > 0); of coef*max
            # it needs every arg; negative coefficients swap the two.
            any_arm = (atom.kind == "min") == (coef > 0)
            checks = (_linear_le0(*_merge(rest, const, arg, coef)) for arg in atom.args)
            return any(checks) if any_arm else all(checks)
        if isinstance(atom, DivMod):
            if atom.kind == "%":
                rest = {a: c for a, c in terms.items() if a is not atom}
                worst = atom.divisor - 1 if coef > 0 else 0
                return _linear_le0(rest, const + coef * worst)
            # arg // k lies in [(arg - k + 1) / k, arg / k]: scale by k and use the end that
            # bounds coef * (arg // k) from above. The form is an integer, so "<= 0" is
            # "k * form <= k - 1": that slack makes it exact enough for t // 2 <= t and, at
            # t >= 1, for (t + 1) // 2 < t + 1.
            k = atom.divisor
            rest = {a: c * k for a, c in terms.items() if a is not atom}
            arg = atom.arg if coef > 0 else atom.arg - (k - 1)
            return _linear_le0(*_merge(rest, const * k - (k - 1), arg, coef))
    pairs: dict[Symbol, list[int]] = {}
    for atom, coef in terms.items():
        if isinstance(atom, Dim):
            pairs.setdefault(atom.bound, [0, 0])[0] += coef
        elif isinstance(atom, Bound):
            pairs.setdefault(atom, [0, 0])[1] += coef
        elif isinstance(atom, Symbol):
            if coef > 0:  # a free non-negative symbol grows without limit
                return False
        else:  # pragma: no cover - every atom kind is handled above
            return False
    apex = const
    for a, b in pairs.values():
        if b > 0 or a + b > 0:
            return False
        apex += b
    return apex <= 0


def _merge(terms: dict[Expr, int], const: int, arg: Expr, coef: int) -> tuple[dict, int]:
    extra, c = arg.linear()
    out = dict(terms)
    for a, k in extra.items():
        out[a] = out.get(a, 0) + coef * k
    return out, const + coef * c


def always_le0(expr: Expr) -> bool:
    """True iff ``expr <= 0`` at every point of the iteration space (False when unsure)."""
    if isinstance(expr, Const):
        return expr.value <= 0
    terms, const = expr.linear()
    return _linear_le0(terms, const)


def always_lt0(expr: Expr) -> bool:
    return always_le0(expr + 1)


def always_eq(a: Expr, b: Expr) -> bool:
    """True iff ``a == b`` at every point of the iteration space (False when unsure)."""
    return always_le0(a - b) and always_le0(b - a)


__all__ = ["always_eq", "always_le0", "always_lt0", "simplify"]


# Conditions are immutable values and guard inference asks the same questions about them
# thousands of times (every union around a recurrence re-simplifies and re-compares its
# parts): memoising the pure queries below cuts the PPO program's domain-conditions pass
# several-fold. Bounded, so a long-lived process does not grow without limit.
_memo = functools.lru_cache(maxsize=1 << 16)


@_memo
def simplify(cond: Condition) -> Condition:
    """Drop comparisons that hold (or fail) at every point of the iteration space."""
    if isinstance(cond, Cmp):
        d = cond.diff
        if cond.op == "<=":
            return TRUE if always_le0(d) else (FALSE if always_lt0(-d) else cond)
        if cond.op == "<":
            return TRUE if always_lt0(d) else (FALSE if always_le0(-d) else cond)
        if cond.op == "==":
            return FALSE if always_lt0(d) or always_lt0(-d) else cond
        return TRUE if always_lt0(d) or always_lt0(-d) else cond
    if isinstance(cond, And):
        return _tighten(And.make(simplify(p) for p in cond.parts))
    if isinstance(cond, Or):
        return _absorb(Or.make(simplify(p) for p in cond.parts))
    if isinstance(cond, Not):
        part = cond.part
        if isinstance(part, Or):  # De Morgan, so the negated comparisons fold with the rest
            return simplify(And.make(Not.make(p) for p in part.parts))
        if isinstance(part, And):
            return simplify(Or.make(Not.make(p) for p in part.parts))
        return Not.make(simplify(part))
    return cond


# --- conjunctions as intervals ------------------------------------------------------------------
# A comparison ``L + c OP 0`` bounds the linear form ``L`` (constant-free, first coefficient
# positive): ``t >= 1`` and ``t != 0`` are both facts about ``t``, and ``t >= 1`` implies the
# other. Guards built by unions around a recurrence pile such facts up; folding them into one
# interval per form keeps guards small and exact.


@dataclass
class _Range:
    lo: int | None = None
    hi: int | None = None
    out: set[int] = field(default_factory=set)
    atoms: int = 0

    def contains(self, other: _Range) -> bool:
        """Every value ``other`` allows, this allows too."""
        if self.lo is not None and (other.lo is None or other.lo < self.lo):
            return False
        if self.hi is not None and (other.hi is None or other.hi > self.hi):
            return False
        return all(
            (other.lo is not None and v < other.lo)
            or (other.hi is not None and v > other.hi)
            or v in other.out
            for v in self.out
        )


@_memo
def _form(cmp: Cmp) -> tuple[Expr, str, int] | None:
    """``cmp`` as (L, kind, value): ``L <= v``, ``L >= v``, ``L == v`` or ``L != v``."""
    terms, const = cmp.diff.linear()
    if not terms:
        return None
    first = min(terms, key=_sort_key)
    sign = 1 if terms[first] > 0 else -1
    form = Const(0)
    for atom, coef in terms.items():
        form = form + atom * (coef * sign)
    value = -const * sign  # sign * (L' + const) OP 0  <=>  L OP' value
    strict = 1 if cmp.op == "<" else 0
    if cmp.op in ("==", "!="):
        return form, cmp.op, value
    if sign > 0:  # L - value OP 0: an upper bound
        return form, "<=", value - strict
    return form, ">=", value + strict  # -(L - value) OP 0: a lower bound


def _ranges(cond: Condition) -> tuple[dict[Expr, _Range], list[Condition]]:
    parts = cond.parts if isinstance(cond, And) else (cond,)
    ranges: dict[Expr, _Range] = {}
    others: list[Condition] = []
    for part in parts:
        form = _form(part) if isinstance(part, Cmp) else None
        if form is None:
            others.append(part)
            continue
        key, kind, v = form
        r = ranges.setdefault(key, _Range())
        r.atoms += 1
        if kind in ("<=", "=="):
            r.hi = v if r.hi is None else min(r.hi, v)
        if kind in (">=", "=="):
            r.lo = v if r.lo is None else max(r.lo, v)
        if kind == "!=":
            r.out.add(v)
    return ranges, others


def _tighten(cond: Condition) -> Condition:
    """Fold the comparisons of a conjunction on the same linear form into one interval."""
    if not isinstance(cond, And):
        return cond
    ranges, others = _ranges(cond)
    if all(r.atoms < 2 for r in ranges.values()):
        return cond
    parts = list(others)
    for part in cond.parts:
        form = _form(part) if isinstance(part, Cmp) else None
        if form is not None and ranges[form[0]].atoms < 2:
            parts.append(part)
    for key, r in ranges.items():
        if r.atoms < 2:
            continue
        while r.lo is not None and r.lo in r.out:
            r.lo += 1
        while r.hi is not None and r.hi in r.out:
            r.hi -= 1
        if r.lo is not None and r.hi is not None and r.lo > r.hi:
            return FALSE
        if r.lo is not None and r.lo == r.hi:
            parts.append(simplify(key.eq(r.lo)))
            continue
        if r.lo is not None:
            parts.append(simplify(key >= r.lo))
        if r.hi is not None:
            parts.append(simplify(key <= r.hi))
        for v in sorted(r.out):
            if (r.lo is None or v > r.lo) and (r.hi is None or v < r.hi):
                parts.append(simplify(key.ne(v)))
    return And.make(parts)


@_memo
def _implies(a: Condition, b: Condition) -> bool:
    """True when ``a`` implies ``b`` as conjunctions of interval facts (False when unsure)."""
    ra, oa = _ranges(a)
    rb, ob = _ranges(b)
    if any(o not in oa for o in ob):
        return False
    return all(key in ra and r.contains(ra[key]) for key, r in rb.items())


@_memo
def union(a: Condition, b: Condition) -> Condition:
    """``a | b`` of two simplified conditions, absorbing disjuncts (without re-simplifying).

    Memoised too: guard inference asks the same unions again at each visit of an op and in
    each pass that infers guards (PPO on CartPole: 25 distinct among 1,859)."""
    return _absorb(Or.make([a, b]))


def _join_alike(parts: tuple[Condition, ...]) -> list[Condition] | None:
    """Disjuncts alike but for an interval of one form, joined where the intervals touch:
    ``(A & (t <= 2)) | (A & (t >= 3))`` is ``A``. A clamped read's pieces split a guard this
    way around a recurrence, and the split doubles at each round. None when nothing joined."""
    out = list(parts)
    joined = False
    k = 0
    while k < len(out):
        for m in range(k + 1, len(out)):
            both = _join_pair(out[k], out[m])
            if both is not None:
                out[k] = both
                del out[m]
                joined = True
                break
        else:
            k += 1
    return out if joined else None


def _join_pair(a: Condition, b: Condition) -> Condition | None:
    """``a | b`` as their common conjuncts and one interval, where what differs between them is
    an interval of the same form on each side and the two touch; else None."""
    pa = a.parts if isinstance(a, And) else (a,)
    pb = b.parts if isinstance(b, And) else (b,)
    only_a = [c for c in pa if c not in pb]
    only_b = [c for c in pb if c not in pa]
    if not only_a or not only_b:
        return None  # one implies the other: absorption's case
    joined = _union_intervals((And.make(only_a), And.make(only_b)))
    if joined is None or len(joined) != 1:
        return None
    return And.make([*(c for c in pa if c in pb), joined[0]])


def _union_intervals(parts: tuple[Condition, ...]) -> list[Condition] | None:
    """Disjuncts that are each one interval of the same form, joined where they touch:
    ``(t == 0) | (t == 1) | (t >= 2)`` is ``t >= 0``. None when nothing was joined."""
    spans: dict[Expr, list[list]] = {}
    rest: list[Condition] = []
    for part in parts:
        ranges, others = _ranges(part)
        if others or len(ranges) != 1:
            rest.append(part)
            continue
        ((key, r),) = ranges.items()
        if r.out:
            rest.append(part)
            continue
        spans.setdefault(key, []).append([r.lo, r.hi])
    joined = False
    out = list(rest)
    inf = float("inf")
    for key, items in spans.items():
        items.sort(key=lambda s: -inf if s[0] is None else s[0])
        merged: list[list] = []
        for lo, hi in items:
            if merged:
                last = merged[-1]
                if last[1] is None or (lo is not None and lo <= last[1] + 1):
                    last[1] = None if hi is None or last[1] is None else max(last[1], hi)
                    joined = True
                    continue
            merged.append([lo, hi])
        for lo, hi in merged:
            cond: Condition = TRUE
            if lo is not None and lo == hi:
                cond = key.eq(lo)
            else:
                if lo is not None:
                    cond = cond & (key >= lo)
                if hi is not None:
                    cond = cond & (key <= hi)
            out.append(simplify(cond))
    return out if joined else None


def _absorb(cond: Condition) -> Condition:
    """Drop the disjuncts that imply another one: ``(t >= 2) | (t >= 1)`` is ``t >= 1``."""
    if not isinstance(cond, Or):
        return cond
    alike = _join_alike(cond.parts)
    if alike is not None:
        cond = Or.make(alike)
        if not isinstance(cond, Or):
            return cond
    joined = _union_intervals(cond.parts)
    if joined is not None:
        cond = Or.make(joined)
        if not isinstance(cond, Or):
            return cond
    kept: list[Condition] = []
    for part in cond.parts:
        if any(_implies(part, other) for other in kept):
            continue
        kept = [other for other in kept if not _implies(other, part)]
        kept.append(part)
    return Or.make(kept)


def pieces(e: Expr) -> list[tuple[Condition, Expr]]:
    """``e`` as ``[(where, affine expression)]``: every min/max over dims split into the cases
    where each argument wins (the first argument on ties), impossible cases dropped.

    ``min(t + 5, T - 1)`` is ``t + 5`` where ``t + 5 <= T - 1`` and ``T - 1`` elsewhere: each
    piece is affine, which is what autodiff can transpose.
    """
    terms, const = e.linear()
    atom = next(
        (
            a
            for a in terms
            if isinstance(a, MinMax) and any(isinstance(s, Dim) for s in a.symbols())
        ),
        None,
    )
    if atom is None:
        return [(TRUE, e)]
    assert isinstance(atom, MinMax)
    rest = Const(const)
    for a, k in terms.items():
        if a is not atom:
            rest = rest + a * k
    out: list[tuple[Condition, Expr]] = []
    args = atom.args
    for j, arg in enumerate(args):
        where: Condition = TRUE
        for m, other in enumerate(args):
            if m == j:
                continue
            lo, hi = (arg, other) if atom.kind == "min" else (other, arg)
            where = where & ((lo < hi) if m < j else (lo <= hi))
        where = simplify(where)
        if where == FALSE:
            continue
        for inner, piece in pieces(rest + arg * terms[atom]):
            both = simplify(where & inner)
            if both != FALSE:
                out.append((both, piece))
    return out
