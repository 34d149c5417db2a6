"""Splitting min/max index expressions into affine pieces (what autodiff transposes)."""

from __future__ import annotations

import pytest

from timerl.symbolic import Dim, max_, min_, pieces


@pytest.mark.parametrize(
    "make",
    [
        lambda t, T: min_(t + 5, T - 1),
        lambda t, T: max_(t - 3, 0),
        lambda t, T: max_(t - 3, 0) + 2 * min_(t, T - 2) - 1,
        lambda t, T: min_(max_(t - 2, 0), T - 3),
        lambda t, T: t + T,
    ],
)
def test_pieces_cover_every_point_once_with_the_right_value(make):
    t = Dim("t")
    T = t.bound
    e = make(t, T)
    parts = pieces(e)
    for n in range(3, 12):
        for k in range(n):
            env = {t: k, T: n}
            hits = [p for where, p in parts if where.evaluate(env)]
            assert len(hits) == 1, (e, env, parts)
            assert hits[0].evaluate(env) == e.evaluate(env)
    for _, p in parts:
        assert "min" not in str(p) and "max" not in str(p)


def test_min_of_bounds_only_is_left_alone():
    t = Dim("t")
    e = min_(t.bound, 5) + t
    assert pieces(e) == [(pieces(t)[0][0], e)]
