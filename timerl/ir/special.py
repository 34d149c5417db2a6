"""The log-gamma function and its first two derivatives, in numpy (the reference semantics of
the ``lgamma``, ``digamma`` and ``trigamma`` primitives).

numpy has none of them and scipy is not a dependency. Each is computed in float64: the
argument is moved up by ``SHIFT`` with the recurrence ``f(x) = f(x + 1) - (term at x)``, then
the asymptotic (Stirling) series is summed at ``z >= SHIFT + 0.5``, where its next term is below
1e-16 relative; arguments below 0.5 go through the reflection formula first. Near lgamma's
zeros at 1 and 2 that difference of two numbers near 13 loses the last digits, so there
lgamma is its Taylor series. Agrees with scipy.special to about 1e-14 relative away from the
poles (the non-positive integers, where the functions are infinite and the results are
``inf`` or ``nan`` as in torch).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

SHIFT = 10
_HALF_LOG_2PI = 0.5 * np.log(2.0 * np.pi)
# Stirling series coefficients B_2k / (2k (2k - 1)) of lgamma, in powers 1 / z^(2k - 1)
_LGAMMA = (1 / 12, -1 / 360, 1 / 1260, -1 / 1680, 1 / 1188, -691 / 360360, 1 / 156)
# B_2k / (2k) of digamma, in powers 1 / z^(2k)
_DIGAMMA = (1 / 12, -1 / 120, 1 / 252, -1 / 240, 1 / 132, -691 / 32760, 1 / 12)
# B_2k of trigamma, in powers 1 / z^(2k + 1)
_TRIGAMMA = (1 / 6, -1 / 30, 1 / 42, -1 / 30, 5 / 66, -691 / 2730, 7 / 6)


def _series(z: np.ndarray, coefs: tuple[float, ...], first: int) -> np.ndarray:
    """``sum_k coefs[k] / z^(first + 2k)`` by Horner's rule in ``1 / z^2``."""
    inv2 = 1.0 / (z * z)
    acc = np.zeros_like(z)
    for c in reversed(coefs):
        acc = acc * inv2 + c
    return acc / z**first


def _as_float(x: Any) -> tuple[np.ndarray, np.dtype]:
    x = np.asarray(x)
    dtype = x.dtype if np.issubdtype(x.dtype, np.floating) else np.dtype(np.float32)
    return x.astype(np.float64), dtype


def _pole(x: np.ndarray) -> np.ndarray:
    """The non-positive integers, where Gamma has its poles."""
    return (x <= 0) & (x == np.floor(x))


def _evaluate(
    x: Any,
    asymptotic: Callable[[np.ndarray], np.ndarray],
    recurrence: Callable[[np.ndarray], np.ndarray],
    reflect: Callable[[np.ndarray, np.ndarray], np.ndarray],
    at_poles: Callable[[np.ndarray], np.ndarray],
) -> np.ndarray:
    """What the three share: ``y`` is the argument, or ``1 - x`` below 0.5; the value at ``y``
    is ``asymptotic(y + SHIFT) + recurrence(y)`` (the series, brought back ``SHIFT`` steps);
    below 0.5 it becomes ``reflect(x, value at 1 - x)``; the poles get ``at_poles(x)``."""
    x, dtype = _as_float(x)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        y = np.where(x < 0.5, 1.0 - x, x)
        out = asymptotic(y + SHIFT) + recurrence(y)
        out = np.where(x < 0.5, reflect(x, out), out)
        out = np.where(_pole(x), at_poles(x), out)
    return out.astype(dtype)


def _steps(y: np.ndarray, term: Callable[[np.ndarray], np.ndarray]) -> np.ndarray:
    """``sum_{k < SHIFT} term(y + k)``."""
    return sum((term(y + k) for k in range(1, SHIFT)), term(y))


def _lgamma_series(z: np.ndarray) -> np.ndarray:
    return (z - 0.5) * np.log(z) - z + _HALF_LOG_2PI + _series(z, _LGAMMA, 1)


def _log_rising(y: np.ndarray) -> np.ndarray:
    """``-log(y (y + 1) ... (y + SHIFT - 1))`` as ``SHIFT log y`` plus one log of the product
    of the ``1 + k / y``: two logs, not ``SHIFT``, and no overflow (the product of the
    ``y + k`` themselves passes float64's range from ``y`` near 1e31)."""
    prod = np.ones_like(y)
    for k in range(1, SHIFT):
        prod = prod * (1.0 + k / y)
    return -(SHIFT * np.log(y) + np.log(prod))


def _zeta_minus_one(k_max: int, n: int = 1000) -> np.ndarray:
    """``zeta(k) - 1`` for ``k = 2 .. k_max``: the sum over ``2 .. n``, smallest terms first,
    plus the Euler-Maclaurin tail (its next term is below 1e-19)."""
    k = np.arange(2, k_max + 1, dtype=np.float64)
    head = (np.arange(n, 1, -1, dtype=np.float64)[None, :] ** -k[:, None]).sum(axis=1)
    m = float(n)
    tail = (
        m ** (1 - k) / (k - 1)
        - m**-k / 2
        + k * m ** (-k - 1) / 12
        - k * (k + 1) * (k + 2) * m ** (-k - 3) / 720
    )
    return head + tail


_EULER_GAMMA = 0.5772156649015329
_NEAR = 0.25  # Taylor series around 1 and 2 within this distance
_ZM1 = _zeta_minus_one(40)  # zeta(k) - 1, k = 2 .. 40


def _near_one_or_two(t: np.ndarray, at_two: bool) -> np.ndarray:
    """``lgamma(1 + t)`` (or ``lgamma(2 + t)``) by its Taylor series, exact in sign and to the
    last bits near its zeros, where the shifted series loses them to cancellation:
    ``-gamma t + sum_k (-1)^k zeta(k) t^k / k`` (``zeta(k) - 1`` around 2)."""
    acc = np.zeros_like(t)
    for j in range(len(_ZM1) - 1, -1, -1):  # Horner in t, from t^40 down to t^2
        k = j + 2
        coef = (-1) ** k * (_ZM1[j] + (0.0 if at_two else 1.0)) / k
        acc = (acc + coef) * t
    return (acc + (1.0 - _EULER_GAMMA if at_two else -_EULER_GAMMA)) * t + 0.0  # no -0.0


def lgamma(x: Any) -> np.ndarray:
    """``log |Gamma(x)|``; by a Taylor series within 0.25 of its zeros at 1 and 2."""
    out = _evaluate(
        x,
        _lgamma_series,
        _log_rising,
        lambda x, v: np.log(np.pi / np.abs(np.sin(np.pi * x))) - v,
        lambda x: np.full_like(x, np.inf),
    )
    xs = np.asarray(x, dtype=np.float64)
    for centre in (1.0, 2.0):
        near = np.abs(xs - centre) < _NEAR
        if near.any():
            taylor = _near_one_or_two(np.where(near, xs - centre, 0.0), centre == 2.0)
            out = np.where(near, taylor.astype(out.dtype), out)
    return np.where(np.isposinf(xs), np.inf, out).astype(out.dtype)  # the series: inf - inf


def digamma(x: Any) -> np.ndarray:
    """``d/dx log Gamma(x)``; at the poles ``-inf`` (0) or ``nan`` (below), as torch."""
    return _evaluate(
        x,
        lambda z: np.log(z) - 0.5 / z - _series(z, _DIGAMMA, 2),
        lambda y: -_steps(y, lambda t: 1.0 / t),
        lambda x, v: v - np.pi / np.tan(np.pi * x),
        lambda x: np.where(x == 0, -np.inf, np.nan),
    )


def trigamma(x: Any) -> np.ndarray:
    """``d^2/dx^2 log Gamma(x)``."""
    return _evaluate(
        x,
        lambda z: 1.0 / z + 0.5 / (z * z) + _series(z, _TRIGAMMA, 3),
        lambda y: _steps(y, lambda t: 1.0 / (t * t)),
        lambda x, v: (np.pi / np.sin(np.pi * x)) ** 2 - v,
        lambda x: np.full_like(x, np.inf),
    )
