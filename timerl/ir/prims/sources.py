"""Sources: constants (``full``, ``const``, ``iota``), an orthogonal weight drawn when the program
runs (``orthogonal``), and counter-based random draws (``uniform``, ``normal``)."""

from __future__ import annotations

import numpy as np

from timerl.ir import counter_rng
from timerl.ir.prims.core import Traits, declared
from timerl.ir.prims.define import define
from timerl.symbolic import Const, as_expr

CONSTANT = Traits(constant=True)


def _np_full(shape, value, dtype):
    return np.full(shape, value, dtype=dtype)


define(
    "full",
    declared,
    _np_full,
    traits=CONSTANT,
    point_attrs=("shape", "value"),
    differentiable=False,
)
define(
    "const",
    lambda s, d, a: (tuple(Const(int(n)) for n in a["value"].shape), a["value"].dtype),
    lambda value: value,
    traits=CONSTANT,
    array_attrs=("value",),
    differentiable=False,
)
define(
    "iota",
    lambda s, d, a: ((as_expr(a["length"]),), np.dtype(a.get("dtype", "int64"))),
    lambda length, dtype="int64": np.arange(length, dtype=dtype),
    traits=CONSTANT,
    point_attrs=("length",),
    differentiable=False,
)


# A draw at least this many times taller than wide is orthonormalised by Cholesky QR
# (``orthogonal_array``); a squarer one, whose condition number Cholesky would square, by
# LAPACK's Householder QR.
CHOLESKY_QR_ASPECT = 4
_SLAB_ROWS = 1024  # rows of the draw multiplied at a time, in place


def orthogonal_array(rows: int, cols: int, gain: float, rng: np.random.Generator) -> np.ndarray:
    """An orthogonal init (well-conditioned at depth; the usual choice for RL policies).

    The orthonormal factor ``Q`` of a standard normal draw ``A = QR`` with ``R``'s diagonal
    positive: unique, so it does not depend on how it is computed. A tall draw (a first
    layer over image observations, 12,288 x 64) is orthonormalised by Cholesky QR in place,
    a slab of rows at a time, twice (the second pass restores orthogonality to rounding):
    its memory is the draw and the result. numpy's Householder QR held about five copies of
    the draw, and the run's resident memory rose 36 MiB at that init (float64, 6 MiB a
    copy): memory-e8's highest point under its 33 MiB budget, before the rollout began.
    """
    n, k = max(rows, cols), min(rows, cols)
    a = rng.standard_normal((n, k))
    if n >= CHOLESKY_QR_ASPECT * k:
        for _ in range(2):
            lower = np.linalg.cholesky(a.T @ a)  # = R^T of the current a
            right = np.linalg.inv(lower).T  # a @ R^-1: the orthonormal factor
            for r in range(0, n, _SLAB_ROWS):
                a[r : r + _SLAB_ROWS] = a[r : r + _SLAB_ROWS] @ right
        q = a
    else:
        q, r = np.linalg.qr(a)
        q *= np.sign(np.diag(r))
    if rows < cols:
        q = q.T
    q = q[:rows, :cols]
    q *= gain
    return q.astype(np.float32)


def _np_orthogonal(shape, dtype, gain, seed):
    rows, cols = (int(n) for n in shape)
    return orthogonal_array(rows, cols, gain, np.random.default_rng(seed)).astype(dtype, copy=False)


# a weight's initial value drawn when the program runs, from its seed: unlike a ``const`` it
# holds no array, so once read (at i == 0) its memory goes back
define("orthogonal", declared, _np_orthogonal, traits=Traits(fresh=True), differentiable=False)


def _np_uniform(shape, dtype, key, batch=()):
    return counter_rng.uniform(np, key, tuple(shape), dtype, batch)


def _np_normal(shape, dtype, key, batch=()):
    return counter_rng.normal(np, key, tuple(shape), dtype, batch)


# Random values are a pure function of (seed, op, point): the same on every backend and in any
# execution order, so random ops can be reordered, vectorised or recomputed like any other.
for _name, _fn in (("uniform", _np_uniform), ("normal", _np_normal)):
    define(
        _name,
        declared,
        _fn,
        traits=Traits(random=True),
        point_attrs=("shape", "key_at"),
        differentiable=False,
    )
