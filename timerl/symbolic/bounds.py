"""Exact sign facts about index expressions over the whole iteration space.

The region is the product over dims ``d`` of ``{0 <= d <= D - 1, D >= 1}`` (``D`` its bound). For
an affine form in dims and bounds that region is a cone with apex ``d = 0, D = 1`` and rays
``(0, 1)`` and ``(1, 1)`` per pair, so ``sup`` is finite iff the form does not grow along any ray
and is then its value at the apex. That one check, exact and symbolic, is all the scheduler's
dependence-direction analysis needs; min/max are handled by choosing arms, mod by its range.
"""

from __future__ import annotations

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
            return False  # floor division: no exact affine bound; answer conservatively
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


__all__ = ["always_le0", "always_lt0", "simplify"]


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
        return And.make(simplify(p) for p in cond.parts)
    if isinstance(cond, Or):
        return Or.make(simplify(p) for p in cond.parts)
    if isinstance(cond, Not):
        return Not.make(simplify(cond.part))
    return cond


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
