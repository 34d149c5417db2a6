"""lgamma, digamma and trigamma (ir/special.py): the numpy reference against scipy, and the
gradients autodiff takes through them."""

from __future__ import annotations

import numpy as np
import pytest

import timerl as tl
from timerl.errors import ProgramError
from timerl.ir import special

sp = pytest.importorskip("scipy.special")

# small, around 1 and 2 (where lgamma is 0), large, and negative non-integers (reflection)
POINTS = np.concatenate(
    [
        np.geomspace(1e-6, 0.49, 60),
        np.linspace(0.5, 30.0, 400),
        np.geomspace(30.0, 1e8, 60),
        np.linspace(-20.95, -0.05, 400),
    ]
)


@pytest.mark.parametrize(
    ("name", "ref"),
    [
        ("lgamma", sp.gammaln),
        ("digamma", sp.digamma),
        ("trigamma", lambda x: sp.polygamma(1, x)),
    ],
)
def test_each_function_agrees_with_scipy(name, ref):
    got, want = getattr(special, name)(POINTS), ref(POINTS)
    # relative where the value is large, absolute where it crosses 0 (lgamma(1) = lgamma(2) = 0)
    np.testing.assert_allclose(got, want, rtol=1e-11, atol=1e-13)
    assert getattr(special, name)(POINTS.astype(np.float32)).dtype == np.float32


def test_huge_arguments_stay_finite_where_the_function_is():
    # the shift's product of x (x + 1) ... overflowed float64 from x near 1e31: lgamma was -inf
    x = np.geomspace(1e8, 1e300, 60)
    np.testing.assert_allclose(special.lgamma(x), sp.gammaln(x), rtol=1e-13)
    np.testing.assert_allclose(special.digamma(x), sp.digamma(x), rtol=1e-13)
    big = np.float32(1e35)  # lgamma(1e35) = 8e36 is a float32
    assert np.isclose(special.lgamma(big), sp.gammaln(1e35), rtol=1e-6)


def test_lgamma_keeps_its_digits_and_sign_next_to_its_zeros_at_one_and_two():
    """Shifted and brought back, lgamma near 1 and 2 is a difference of numbers near 13 and
    loses its last digits (1.8e-15 instead of 0 at 1, a sign test could flip); a Taylor
    series around each zero keeps them."""
    mpmath = pytest.importorskip("mpmath")  # scipy's own is off by up to 3e-16 here
    assert special.lgamma(np.array([1.0, 2.0])).tolist() == [0.0, 0.0]
    step = np.geomspace(1e-14, 0.2, 200)
    near = np.concatenate([1.0 + step, 1.0 - step, 2.0 + step, 2.0 - step])
    with mpmath.workdps(40):
        want = np.array([float(mpmath.loggamma(mpmath.mpf(float(v)))) for v in near])
    np.testing.assert_allclose(special.lgamma(near), want, rtol=1e-13)
    assert np.all(np.sign(special.lgamma(near)) == np.sign(want))


def test_the_poles_give_what_torch_gives():
    poles = np.array([0.0, -1.0, -4.0])
    assert np.all(np.isposinf(special.lgamma(poles)))
    assert np.isneginf(special.digamma(poles)[0]) and np.all(np.isnan(special.digamma(poles)[1:]))
    assert np.all(np.isposinf(special.trigamma(poles)))
    assert np.isposinf(special.lgamma(np.array(np.inf)))


def test_lgammas_gradient_is_digamma_and_digammas_is_trigamma():
    x_np = np.array([0.3, 1.0, 2.5, 7.0], dtype=np.float32)
    with tl.Context(dims=("t",)):
        x = tl.from_numpy(x_np, requires_grad=True)
        y = tl.from_numpy(x_np + 1.0, requires_grad=True)
        loss = x.lgamma().sum() + y.digamma().sum()
        loss.backward()
    gx, gy = tl.evaluate([x.grad, y.grad])
    np.testing.assert_allclose(gx, sp.digamma(x_np.astype(np.float64)), rtol=1e-6)
    np.testing.assert_allclose(gy, sp.polygamma(1, x_np.astype(np.float64) + 1.0), rtol=1e-6)


def test_trigammas_missing_gradient_is_an_error_not_a_zero():
    with tl.Context(dims=("t",)):
        x = tl.from_numpy(np.array([1.5], dtype=np.float32), requires_grad=True)
        with pytest.raises(ProgramError, match="trigamma has no gradient"):
            x.trigamma().sum().backward()
