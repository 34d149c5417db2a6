"""Property tests of the index-expression algebra in ``timerl.symbolic``.

Every expression is compared with the same arithmetic done on plain Python ints at random points.
"""

from __future__ import annotations

import operator

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from timerl.symbolic import (
    FALSE,
    TRUE,
    Bound,
    Const,
    Dim,
    Slice,
    always_le0,
    always_lt0,
    as_expr,
    compile_exprs,
    floordiv,
    max_,
    min_,
    mod,
    vevaluate,
)

# Two dims with their bounds, and one free (non-dim) bound-like symbol.
I_DIM = Dim("i")
T_DIM = Dim("t")
I_B, T_B = I_DIM.bound, T_DIM.bound
SYMBOLS = (I_DIM, T_DIM, I_B, T_B)

small = st.integers(-20, 20)
coef = st.integers(-5, 5)


@st.composite
def affine(draw):
    """A random affine expression together with a Python function computing it."""
    coefs = [draw(coef) for _ in SYMBOLS]
    const = draw(small)
    expr = as_expr(const)
    for c, s in zip(coefs, SYMBOLS, strict=True):
        expr = expr + c * s
    return expr, lambda env: sum(c * env[s] for c, s in zip(coefs, SYMBOLS, strict=True)) + const


@st.composite
def envs(draw):
    """A point of the iteration space: 0 <= d <= D - 1 for each dim."""
    ib = draw(st.integers(1, 30))
    tb = draw(st.integers(1, 30))
    return {
        I_B: ib,
        T_B: tb,
        I_DIM: draw(st.integers(0, ib - 1)),
        T_DIM: draw(st.integers(0, tb - 1)),
    }


@st.composite
def exprs(draw, depth=2):
    """A random expression tree (affine, min/max, floordiv/mod) and its Python evaluator."""
    if depth == 0 or draw(st.booleans()):
        return draw(affine())
    kind = draw(st.sampled_from(["add", "sub", "scale", "min", "max", "div", "mod", "neg"]))
    a, fa = draw(exprs(depth=depth - 1))
    if kind in ("add", "sub", "min", "max"):
        b, fb = draw(exprs(depth=depth - 1))
        if kind == "add":
            return a + b, lambda env: fa(env) + fb(env)
        if kind == "sub":
            return a - b, lambda env: fa(env) - fb(env)
        if kind == "min":
            return min_(a, b), lambda env: min(fa(env), fb(env))
        return max_(a, b), lambda env: max(fa(env), fb(env))
    if kind == "neg":
        return -a, lambda env: -fa(env)
    if kind == "scale":
        k = draw(coef)
        return a * k, lambda env: fa(env) * k
    d = draw(st.integers(1, 7))
    if kind == "div":
        return floordiv(a, d), lambda env: fa(env) // d
    return mod(a, d), lambda env: fa(env) % d


# --- canonical forms ----------------------------------------------------------------------------


def test_shift_and_unshift_is_identity():
    t = T_DIM
    assert (t + 1) - 1 == t
    assert (t - 3) + 3 == t
    assert t + 0 == t
    assert 1 * t == t
    assert t - t == Const(0)
    assert (t + 1) - (t + 1) == Const(0)
    assert T_B - 1 == (T_B + 2) - 3


@given(affine(), affine(), affine())
def test_addition_commutative_and_associative(a, b, c):
    (ea, _), (eb, _), (ec, _) = a, b, c
    assert ea + eb == eb + ea
    assert (ea + eb) + ec == ea + (eb + ec)
    assert hash(ea + eb) == hash(eb + ea)
    assert (ea - eb) + eb == ea


@given(affine(), affine(), st.integers(-6, 6), st.integers(-6, 6))
def test_constant_multiplication_distributes(a, b, k, m):
    (ea, _), (eb, _) = a, b
    assert k * (ea + eb) == k * ea + k * eb
    assert (k + m) * ea == k * ea + m * ea
    assert (ea * k) * m == ea * (k * m)
    assert -ea * -1 == ea


@given(affine(), exprs(), small)
def test_min_max_identities(a, b, c):
    (ea, _), (eb, _) = a, b
    assert min_(ea, ea) == ea
    assert max_(ea, ea) == ea
    assert min_(ea, eb) == min_(eb, ea)
    assert max_(ea, eb) == max_(eb, ea)
    assert min_(ea, ea + 1) == ea
    assert max_(ea, ea + 1) == ea + 1
    assert min_(ea + c, ea) == (ea + c if c < 0 else ea)
    assert min_(Const(3), Const(c)) == Const(min(3, c))
    assert max_(Const(3), Const(c)) == Const(max(3, c))


def test_non_affine_products_are_rejected():
    with pytest.raises(TypeError):
        _ = T_DIM * T_DIM
    with pytest.raises(TypeError):
        _ = T_DIM * I_DIM
    with pytest.raises(TypeError):
        floordiv(T_DIM, 0)
    with pytest.raises(TypeError):
        mod(T_DIM, -2)
    with pytest.raises(TypeError):
        floordiv(T_DIM, T_DIM)


def test_expressions_have_no_truth_value():
    with pytest.raises(TypeError):
        bool(T_DIM + 1)
    with pytest.raises(TypeError):
        bool(T_DIM < 3)


def test_structural_equality_is_not_a_condition():
    t = T_DIM
    assert (t == t) is True
    assert (t == t + 1) is False
    assert {t + 1: "a"}[1 + t] == "a"
    other = Dim("t")
    assert other != t  # two dims with the same name are different symbols


# --- evaluation ---------------------------------------------------------------------------------


@settings(max_examples=300)
@given(exprs(depth=3), envs())
def test_evaluation_matches_python_ints(e, env):
    expr, fn = e
    assert expr.evaluate(env) == fn(env)


@settings(max_examples=100)
@given(exprs(depth=3), envs())
def test_compiled_and_vectorised_evaluation_agree(e, env):
    expr, fn = e
    f = compile_exprs([expr], SYMBOLS)
    assert f(*(env[s] for s in SYMBOLS)) == (fn(env),)
    assert int(vevaluate(expr, env)) == fn(env)


@given(exprs(depth=2), envs(), st.integers(-3, 3))
def test_substitution_agrees_with_evaluation(e, env, shift):
    expr, fn = e
    sub = expr.substitute({T_DIM: T_DIM + shift})
    shifted = dict(env)
    shifted[T_DIM] = env[T_DIM] + shift
    assert sub.evaluate(env) == fn(shifted)


@given(st.integers(-100, 100), st.integers(1, 12), affine(), envs())
def test_floordiv_and_mod_match_python(n, d, a, env):
    assert floordiv(n, d) == Const(n // d)
    assert mod(n, d) == Const(n % d)
    expr, fn = a
    v = fn(env)
    assert floordiv(expr, d).evaluate(env) == v // d
    assert mod(expr, d).evaluate(env) == v % d
    assert (expr // d).evaluate(env) == v // d
    assert (expr % d).evaluate(env) == v % d
    # the division identity holds symbolically evaluated too
    assert (d * floordiv(expr, d) + mod(expr, d)).evaluate(env) == v


@given(affine(), small, envs())
def test_negative_values_floor_like_python(a, c, env):
    expr, fn = a
    neg = -expr - 50 + c
    assert floordiv(neg, 3).evaluate(env) == (-fn(env) - 50 + c) // 3
    assert mod(neg, 3).evaluate(env) == (-fn(env) - 50 + c) % 3


# --- conditions ---------------------------------------------------------------------------------

CMPS = [
    (operator.lt, operator.lt),
    (operator.le, operator.le),
    (operator.gt, operator.gt),
    (operator.ge, operator.ge),
    (lambda a, b: a.eq(b), operator.eq),
    (lambda a, b: a.ne(b), operator.ne),
]


@st.composite
def conditions(draw, depth=2):
    if depth == 0 or draw(st.booleans()):
        sym, py = draw(st.sampled_from(CMPS))
        a, fa = draw(exprs(depth=1))
        b, fb = draw(exprs(depth=1))
        return sym(a, b), lambda env: py(fa(env), fb(env))
    kind = draw(st.sampled_from(["and", "or", "not", "lit"]))
    if kind == "lit":
        v = draw(st.booleans())
        c, fc = draw(conditions(depth=depth - 1))
        return (
            (c & v, lambda env: fc(env) and v)
            if draw(st.booleans())
            else (
                c | v,
                lambda env: fc(env) or v,
            )
        )
    a, fa = draw(conditions(depth=depth - 1))
    if kind == "not":
        return ~a, lambda env: not fa(env)
    b, fb = draw(conditions(depth=depth - 1))
    if kind == "and":
        return a & b, lambda env: fa(env) and fb(env)
    return a | b, lambda env: fa(env) or fb(env)


# building depth-3 conditions takes a while on a loaded machine: only the result is checked
@settings(max_examples=150, suppress_health_check=[HealthCheck.too_slow])
@given(conditions(depth=3), envs())
def test_conditions_evaluate_like_python_booleans(c, env):
    cond, fn = c
    assert cond.evaluate(env) == fn(env)
    assert bool(vevaluate(cond, env)) == fn(env)
    assert compile_exprs([cond], SYMBOLS)(*(env[s] for s in SYMBOLS))[0] == fn(env)


@given(conditions(depth=2), envs())
def test_double_negation_and_de_morgan(c, env):
    cond, fn = c
    assert (~~cond).evaluate(env) == fn(env)
    other = T_DIM < 5
    assert (~(cond & other)).evaluate(env) == ((~cond) | (~other)).evaluate(env)
    assert (~(cond | other)).evaluate(env) == ((~cond) & (~other)).evaluate(env)


def test_constant_conditions_fold():
    assert (Const(1) < 2) == TRUE
    assert (Const(3) <= 2) == FALSE
    assert (T_DIM.eq(T_DIM)) == TRUE
    assert (T_DIM + 1 > T_DIM) == TRUE
    assert ((T_DIM < 3) & False) == FALSE
    assert ((T_DIM < 3) | True) == TRUE
    assert ((T_DIM < 3) & True) == (T_DIM < 3)


# --- sign facts ---------------------------------------------------------------------------------


@settings(max_examples=200)
@given(exprs(depth=2), st.lists(envs(), min_size=20, max_size=20))
def test_always_le0_is_never_wrong(e, points):
    expr, fn = e
    if always_le0(expr):
        for env in points:
            assert fn(env) <= 0, (expr, env)
    if always_lt0(expr):
        for env in points:
            assert fn(env) < 0, (expr, env)


@settings(max_examples=300)
@given(affine())
def test_always_le0_is_sound_at_the_extremes(a):
    """Check the corners of the region (d = 0 or D - 1, D small or large) too."""
    expr, fn = a
    if not always_le0(expr):
        return
    for ib in (1, 2, 50):
        for tb in (1, 2, 50):
            for iv in {0, ib - 1}:
                for tv in {0, tb - 1}:
                    env = {I_B: ib, T_B: tb, I_DIM: iv, T_DIM: tv}
                    assert fn(env) <= 0, (expr, env)


def test_always_le0_proves_the_facts_scheduling_needs():
    t, T = T_DIM, T_B
    assert always_le0(t - (T - 1))  # t <= T - 1
    assert always_lt0(t - T)
    assert always_le0(-t)  # t >= 0
    assert always_le0(min_(t + 5, T - 1) - (T - 1))
    assert always_le0(-max_(t - 3, 0))
    assert always_le0(mod(t, 4) - 3)
    assert always_le0(floordiv(t, 2) - t)  # t // 2 <= t
    assert always_lt0(floordiv(t + 1, 2) - (t + 1))  # t // 2 < t where t >= 1
    assert always_lt0(floordiv(t + 2, 3) - (t + 2))  # t // 3 < t where t >= 2 (t = 1 too)
    assert not always_lt0(floordiv(t, 2) - t)  # t = 0
    assert not always_le0(t - 1)
    assert not always_le0(t + 1 - (T - 1))
    assert not always_le0(max_(t + 5, T - 1) - (T - 1))


def test_slice_size_and_substitution():
    t, T = T_DIM, T_B
    s = Slice(as_expr(0), t + 1)
    assert s.size == t + 1
    assert s.substitute({t: t - 1}) == Slice(Const(0), t)
    assert Slice(t, T).size == T - t
    assert s.symbols() == frozenset({t})


def test_bounds_belong_to_their_dims():
    d = Dim("k")
    assert isinstance(d.bound, Bound)
    assert d.bound.dim is d
    assert d.bound.name == "K"
