"""Sources: constants (``full``, ``const``, ``iota``), an orthogonal weight drawn when the program
runs (``orthogonal``), and counter-based random draws (``uniform``, ``normal``)."""

from __future__ import annotations

import numpy as np

import timerl.ir.prims.cost as cost
from timerl.ir import counter_rng
from timerl.ir.prims.batching import Batch, Batched, Batching, Decline
from timerl.ir.prims.core import Traits, declared
from timerl.ir.prims.define import define
from timerl.ir.prims.table import Declined
from timerl.symbolic import Const, Expr, as_expr

CONSTANT = Traits(constant=True)
# a source has no operands whose rows it could follow
_NO_ROWS = Declined("a source: it reads no rows")
_CONSTANT_BATCH = Declined("a constant is the same at every point: it is not batched")


def _np_full(shape, value, dtype):
    return np.full(shape, value, dtype=dtype)


define(
    "full",
    declared,
    _np_full,
    traits=CONSTANT,
    cost=cost.per_output,
    batching=_CONSTANT_BATCH,
    rows=_NO_ROWS,
    simplify=(),
    point_attrs=("shape", "value"),
    differentiable=False,
)
define(
    "const",
    lambda s, d, a: (tuple(Const(int(n)) for n in a["value"].shape), a["value"].dtype),
    lambda value: value,
    traits=CONSTANT,
    cost=cost.per_output,
    batching=_CONSTANT_BATCH,
    rows=_NO_ROWS,
    simplify=(),
    array_attrs=("value",),
    differentiable=False,
)
define(
    "iota",
    lambda s, d, a: ((as_expr(a["length"]),), np.dtype(a.get("dtype", "int64"))),
    lambda length, dtype="int64": np.arange(length, dtype=dtype),
    traits=CONSTANT,
    cost=cost.per_output,
    batching=_CONSTANT_BATCH,
    rows=_NO_ROWS,
    simplify=(),
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
define(
    "orthogonal",
    declared,
    _np_orthogonal,
    traits=Traits(fresh=True),
    cost=cost.per_output,
    batching=Declined("a weight's initial value, drawn once: no batching rule written"),
    rows=_NO_ROWS,
    simplify=(),
    differentiable=False,
)


def _np_uniform(shape, dtype, key, batch=()):
    return counter_rng.uniform(np, key, tuple(shape), dtype, batch)


def _np_normal(shape, dtype, key, batch=()):
    return counter_rng.normal(np, key, tuple(shape), dtype, batch)


def _batch_random(b: Batch) -> Batched:
    """A random op's numbers are a function of its key ``(seed, stream, *coords)``: batched,
    the coordinates that move with the dim become ``coord at 0 + coef * arange(size)`` along
    a new leading axis (the ``batch`` attribute), so the one draw equals the points' draws."""
    attrs = dict(b.op.attrs)
    coords = attrs.get("key_at") or tuple(b.op.domain)
    moved: list[tuple[int, int]] = []
    fixed: list[Expr] = []
    for pos, coord in enumerate(coords):
        if not (isinstance(coord, Expr) and b.dim in coord.symbols()):
            fixed.append(coord)
            continue
        terms, _ = coord.linear()
        coef = terms.get(b.dim)
        if coef is None or any(b.dim in a.symbols() for a in terms if a is not b.dim):
            raise Decline(f"its key coordinate {coord} is not affine in {b.dim.name}")
        moved.append((pos, coef))
        fixed.append(coord.substitute({b.dim: Const(0)}))
    attrs["key_at"] = tuple(fixed)
    attrs["batch"] = (*attrs.get("batch", ()), (b.size, tuple(moved)))
    attrs["stream"] = attrs.get("stream", b.op.id)
    return Batched(b.op.prim, attrs, from_unbatched=True)


# Random values are a pure function of (seed, op, point): the same on every backend and in any
# execution order, so random ops can be reordered, vectorised or recomputed like any other.
for _name, _fn in (("uniform", _np_uniform), ("normal", _np_normal)):
    define(
        _name,
        declared,
        _fn,
        traits=Traits(random=True),
        # its key's coordinates are read per point and may mention the dim
        cost=cost.per_output,
        batching=Batching(_batch_random, dim_attrs=("key_at",)),
        rows=_NO_ROWS,
        simplify=(),
        point_attrs=("shape", "key_at"),
        differentiable=False,
    )
