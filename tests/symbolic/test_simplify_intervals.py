"""Interval folding in ``simplify``, floor-division bounds, and index arithmetic with floats."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from timerl.errors import IndexExprError
from timerl.symbolic import FALSE, TRUE, Dim, always_le0, simplify

t = Dim("t")
T = t.bound


def _points(max_bound: int = 7):
    for bound in range(1, max_bound + 1):
        for point in range(bound):
            yield {t: point, T: bound}


def _atom(kind: int, k: int):
    return [t >= k, t < k, t.eq(k), t.ne(k), t + k < T, t >= T - k][kind]


atoms = st.builds(_atom, st.integers(0, 5), st.integers(-1, 4))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.lists(atoms, min_size=1, max_size=4), min_size=1, max_size=4))
def test_simplify_keeps_the_meaning_of_unions_of_conjunctions(parts):
    cond = FALSE
    for conj in parts:
        term = conj[0]
        for a in conj[1:]:
            term = term & a
        cond = cond | term
    simple = simplify(cond)
    for env in _points():
        assert simple.evaluate(env) == cond.evaluate(env), (cond, simple, env)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(
        st.tuples(st.lists(atoms, min_size=1, max_size=3), st.booleans(), st.booleans()),
        min_size=1,
        max_size=4,
    )
)
def test_simplify_keeps_the_meaning_of_negated_and_nested_conditions(parts):
    cond = TRUE
    for conj, negate, join_and in parts:
        term = FALSE
        for a in conj:
            term = term | a
        term = ~term if negate else term
        cond = (cond & term) if join_and else (cond | ~term)
    simple = simplify(cond)
    for env in _points():
        assert simple.evaluate(env) == cond.evaluate(env), (cond, simple, env)


def test_negations_and_touching_intervals_fold():
    assert simplify(t.eq(0) | t.eq(1) | ((t >= 2) & ~(t.eq(0) | t.eq(1)))) == TRUE
    assert simplify((t >= 2) & ~(t.eq(0) | t.eq(1))) == (t >= 2)
    assert simplify(t.eq(1) | t.eq(2) | (t >= 3)) == (t >= 1)
    assert simplify(t.eq(0) | t.eq(2)) == (t.eq(0) | t.eq(2))


def test_conjunctions_fold_into_one_interval():
    assert simplify((t >= 1) & t.ne(0)) == (t >= 1)
    assert simplify((t >= 2) & t.ne(1) & (t >= 1) & t.ne(0)) == (t >= 2)
    assert simplify((t >= 3) & (t <= 3)) == t.eq(3)
    assert simplify((t >= 4) & (t < 3)) == FALSE


def test_disjuncts_implied_by_another_are_absorbed():
    guard = ((t >= 2) & t.ne(1) & (t >= 1) & t.ne(0)) | ((t >= 1) & t.ne(0))
    assert simplify(guard) == (t >= 1)
    assert simplify((t >= 1) | (t.eq(3) & (t + 1 < T))) == (t >= 1)


@pytest.mark.parametrize(
    ("expr", "holds"),
    [
        (t // 2 - t, True),
        (t // 2 - T + 1, True),
        ((t + 1) // 3 - t, True),  # needs the integer slack: (t + 1) / 3 - t > 0 at t = 0
        (t - t // 2 - 1, False),
    ],
    ids=["half_le_t", "half_le_T", "integer_slack", "false"],
)
def test_floordiv_upper_bounds_are_sound(expr, holds):
    assert always_le0(expr) is holds
    if holds:
        assert all(expr.evaluate(env) <= 0 for env in _points())


@pytest.mark.parametrize(("a", "k", "b"), list(itertools.product([-2, 0, 3], [2, 3], [-1, 0])))
def test_floordiv_bounds_never_claim_a_false_fact(a, k, b):
    for expr in ((t + a) // k + b - t, t - (t + a) // k + b, (t + a) // k - T + b):
        if always_le0(expr):
            assert all(expr.evaluate(env) <= 0 for env in _points()), expr


def test_division_shows_its_argument_in_parentheses():
    assert str((t + 1) // 2) == "((t + 1) // 2)"
    assert str(t % 3) == "(t % 3)"


@pytest.mark.parametrize("make", [lambda: t + 1.0, lambda: 0.5 * t, lambda: T - t - 0.5])
def test_an_index_plus_a_float_is_a_timerl_error(make):
    with pytest.raises(IndexExprError, match="integer index expression"):
        make()


def test_disjuncts_alike_but_for_touching_intervals_are_joined():
    # a clamped read's pieces split a guard so around a recurrence, doubling at each round
    a = T.ne(t + 1)
    assert simplify((a & (t <= 2)) | (a & (t >= 3))) == a
    assert simplify((a & (t >= 1) & (t <= 2)) | (a & (t >= 3) & (t <= 6))) == simplify(
        a & (t >= 1) & (t <= 6)
    )
    gap = (a & (t <= 2)) | (a & (t >= 4))
    assert simplify(gap) != a and not any(simplify(gap).evaluate(p) for p in _points() if p[t] == 3)
