"""Symbolic shape arithmetic shared by the primitives' inference rules."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from timerl.errors import ShapeError, TimerlError
from timerl.symbolic import Const, Expr, as_expr

ONE = Const(1)


def broadcast(*shapes: Sequence[Expr], what: str = "operands") -> tuple[Expr, ...]:
    """NumPy broadcasting over symbolic sizes: sizes must be equal, or one of them 1."""
    rank = max((len(s) for s in shapes), default=0)
    out: list[Expr] = []
    for k in range(rank):
        size: Expr = ONE
        for shape in shapes:
            j = k - (rank - len(shape))
            if j < 0:
                continue
            s = shape[j]
            if s in (ONE, size):
                continue
            if size == ONE:
                size = s
                continue
            raise ShapeError(
                f"cannot broadcast {what} of shapes "
                + " and ".join(str(tuple(x)) for x in shapes)
                + f": size {size} against {s}"
            )
        out.append(size)
    return tuple(out)


def numel(shape: Sequence[Expr]) -> Expr:
    """The element count; affine as long as at most one size is symbolic."""
    total: Expr = ONE
    for s in shape:
        if isinstance(s, Const):
            total = total * s.value
        elif isinstance(total, Const):
            total = s * total.value
        else:
            raise ShapeError(f"the element count of shape {tuple(shape)} is not affine")
    return total


def norm_axis(axis: int, rank: int, what: str = "axis") -> int:
    if not -rank <= axis < max(rank, 1):
        raise ShapeError(f"{what} {axis} is out of range for a tensor of rank {rank}")
    return axis % rank if rank else 0


def promote(*dtypes: np.dtype) -> np.dtype:
    return np.result_type(*dtypes)


def static(shape: Sequence[Expr]) -> tuple[int, ...] | None:
    """Concrete sizes when every size is a constant, else None."""
    if all(isinstance(s, Const) for s in shape):
        return tuple(s.value for s in shape)  # type: ignore[attr-defined]
    return None


def static_nbytes(
    shape: Sequence[Expr], dtype: Any, bounds: Mapping[Any, int] | None = None
) -> int | None:
    """Bytes of a value of ``shape`` with its bounds at ``bounds`` (none given: constant
    sizes only); None where a size needs anything else (a loop's dim, a dynamic bound)."""
    n = 1
    try:
        for s in shape:
            n *= int(s.evaluate(bounds or {}))
    except (KeyError, TypeError, ValueError, TimerlError):
        return None
    return n * np.dtype(dtype).itemsize


def shape_of(sizes: Sequence[int | Expr]) -> tuple[Expr, ...]:
    return tuple(as_expr(s) for s in sizes)
