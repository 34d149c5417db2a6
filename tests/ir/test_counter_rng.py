"""The counter-based generator: sound statistics, pure in its key, batched = point by point."""

from __future__ import annotations

import numpy as np
import pytest

from timerl.ir import counter_rng as rng
from timerl.ir.prims import REGISTRY


def test_uniform_and_normal_moments():
    u = rng.uniform(np, (7, 3, 11), (200_000,), np.float32)
    assert u.min() >= 0.0 and u.max() < 1.0
    assert abs(u.mean() - 0.5) < 0.005 and abs(u.var() - 1 / 12) < 0.002
    z = rng.normal(np, (7, 3, 11), (200_000,), np.float64)
    assert abs(z.mean()) < 0.01 and abs(z.std() - 1.0) < 0.01
    assert abs((np.abs(z) > 2).mean() - 0.0455) < 0.003  # the tails of a normal, not a box


def test_neighbouring_keys_and_elements_are_uncorrelated():
    a = rng.uniform(np, (0, 0, 1), (100_000,), np.float64)
    b = rng.uniform(np, (0, 0, 2), (100_000,), np.float64)
    assert abs(np.corrcoef(a, b)[0, 1]) < 0.02
    assert abs(np.corrcoef(a[:-1], a[1:])[0, 1]) < 0.02


def test_the_key_decides_everything():
    first = rng.normal(np, (5, 1, 2), (4, 3), np.float32)
    np.testing.assert_array_equal(first, rng.normal(np, (5, 1, 2), (4, 3), np.float32))
    assert not np.allclose(first, rng.normal(np, (5, 1, 3), (4, 3), np.float32))
    assert not np.allclose(first, rng.normal(np, (6, 1, 2), (4, 3), np.float32))
    # a seed wider than 32 bits contributes its high bits too
    assert not np.allclose(
        rng.uniform(np, (2**40 + 1, 0), (8,), np.float32), rng.uniform(np, (1, 0), (8,), np.float32)
    )


@pytest.mark.parametrize("prim", ["uniform", "normal"])
def test_a_batched_draw_equals_the_points_draws(prim):
    impl = REGISTRY[prim].impl
    # batched over t (coordinate 1, coefficient 2) and then over i (coordinate 0)
    batch = ((3, ((1, 2),)), (4, ((0, 1),)))
    both = impl((2, 5), np.float32, (9, 17, 0, 1), batch)
    assert both.shape == (4, 3, 2, 5)
    for i in range(4):
        for t in range(3):
            one = impl((2, 5), np.float32, (9, 17, i, 1 + 2 * t))
            np.testing.assert_array_equal(both[i, t], one)


def test_jax_draws_the_same_bits():
    jnp = pytest.importorskip("jax.numpy", reason="the jax extra is not installed")
    words_np = rng.bits(np, (3, 4, np.arange(5)), (6,), lead=(5,))
    words_jax = np.asarray(rng.bits(jnp, (3, 4, jnp.arange(5)), (6,), lead=(5,)))
    np.testing.assert_array_equal(words_np, words_jax)
