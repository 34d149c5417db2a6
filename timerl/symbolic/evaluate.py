"""Evaluating index expressions and conditions many times over: compiled into one Python
function for a hot loop (``compile_exprs``), or over arrays of points at once (``vevaluate``:
validation checks whole domains; the jax backend evaluates on traced loop indices)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

from timerl.symbolic.expr import (
    _CMP,
    Affine,
    And,
    Cmp,
    Condition,
    Const,
    DivMod,
    Expr,
    Literal,
    MinMax,
    Not,
    Or,
    Symbol,
)


def compile_exprs(
    items: Iterable[Expr | Condition], symbols: Iterable[Symbol]
) -> Callable[..., tuple]:
    """One Python function computing many expressions from symbol values, for hot loops."""
    symbols, items = list(symbols), list(items)
    if not items:
        return lambda *_: ()
    names = {s: f"_s{k}" for k, s in enumerate(symbols)}
    body = ", ".join(item.source(names) for item in items)
    args = ", ".join(names[s] for s in symbols)
    code = f"lambda {args}: ({body},)"
    return eval(code, {"min": min, "max": max})  # noqa: S307 - source built from our own nodes


def vevaluate(item: Expr | Condition, env: Mapping[Symbol, object], xp: Any = None) -> object:
    """Evaluate over arrays of points at once (validation checks whole domains); ``xp`` is the
    array module (numpy by default; ``jax.numpy`` where the values are traced)."""
    if xp is None:
        import numpy as xp

    if isinstance(item, Const):
        return item.value
    if isinstance(item, Symbol):
        return env[item]
    if isinstance(item, Affine):
        total: object = item.const
        for atom, coef in item.terms:
            total = total + coef * vevaluate(atom, env, xp)  # type: ignore[operator]
        return total
    if isinstance(item, MinMax):
        fn = xp.minimum if item.kind == "min" else xp.maximum
        values = [vevaluate(a, env, xp) for a in item.args]
        out = values[0]
        for v in values[1:]:
            out = fn(out, v)
        return out
    if isinstance(item, DivMod):
        arg = vevaluate(item.arg, env, xp)
        return arg // item.divisor if item.kind == "//" else arg % item.divisor  # type: ignore[operator]
    if isinstance(item, Literal):
        return item.value
    if isinstance(item, Cmp):
        return _CMP[item.op](vevaluate(item.diff, env, xp))
    if isinstance(item, And):
        out = True
        for p in item.parts:
            out = xp.logical_and(out, vevaluate(p, env, xp))
        return out
    if isinstance(item, Or):
        out = False
        for p in item.parts:
            out = xp.logical_or(out, vevaluate(p, env, xp))
        return out
    if isinstance(item, Not):
        return xp.logical_not(vevaluate(item.part, env, xp))
    raise TypeError(f"cannot evaluate {item!r}")
