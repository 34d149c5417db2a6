"""The batching table: how each primitive runs once over every point of a dim
(``compiler/vectorize.py``, JAX's ``vmap`` rules).

A rule gets the op, which of its operands are batched (read at the dim itself) and their
per-point shapes, and returns the batched op's primitive and attributes (``Batched``: its
value is the per-point values stacked along a new leading axis), or raises ``Decline`` with
the reason. The rules shared by a family of primitives are here; the others are beside their
primitive's definition.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from timerl.ir.prims.table import RuleTable
from timerl.symbolic import Bound, Const, Dim, Expr

if TYPE_CHECKING:
    from timerl.ir.graph import Op

Shape = tuple[Expr, ...]


class Decline(Exception):
    """A batching rule (or a check) cannot show the batched op has the same value."""


@dataclass(frozen=True)
class Run:
    """Points ``lo .. hi - 1`` of the dim where a piecewise definition takes branch
    ``branch``, which reads its source at ``dim + offset`` (None: not along the dim)."""

    branch: int
    lo: int
    hi: int
    offset: int | None


@dataclass(frozen=True)
class Batched:
    """A batching rule's answer: the batched op's primitive and attributes. Batched operands
    of rank below ``operand_rank`` get singleton axes after the batch axis first, so operands
    without the batch axis broadcast against the others as they did point by point.
    ``from_unbatched``: its batched value needs no batched operand (the points of a value over
    the whole range, a random draw)."""

    prim: str
    attrs: dict[str, Any]
    operand_rank: int | None = None
    runs: tuple[Run, ...] = ()
    from_unbatched: bool = False


@dataclass(frozen=True)
class Batch:
    """What a rule sees: the op, which inputs are batched, their per-point shapes, the dim."""

    op: Op
    batched: tuple[bool, ...]
    shapes: tuple[Shape, ...]
    dim: Dim
    size: int


BatchRule = Callable[[Batch], Batched]


@dataclass(frozen=True)
class Batching:
    """A primitive's batching entry: its ``rule``; the attributes the rule reads at each point,
    which may mention the dim (``dim_attrs``); and for a primitive whose attributes, not only
    its reads, decide where it is defined (validation checks reads), whether an op of it is
    defined at every point of its domain at these bounds (``defined``)."""

    rule: BatchRule
    dim_attrs: tuple[str, ...] = ()
    defined: Callable[[Op, Mapping[Bound, int]], bool] | None = None


TABLE: RuleTable[Batching] = RuleTable("batching", "a Batching rule (compiler/vectorize.py)")


def batching(prim: str) -> Batching | None:
    """The primitive's batching entry (None: it is declined, it is not batched)."""
    return TABLE.rule(prim)


# --- rules shared by families of primitives ----------------------------------------------------


def shift(axis: int) -> int:
    """A non-negative axis moves past the batch axis; a negative one counts from the end."""
    return axis + 1 if axis >= 0 else axis


def point_rank(b: Batch) -> int:
    return len(b.op.shape)


def elementwise(b: Batch) -> Batched:
    attrs = dict(b.op.attrs)
    if "shape" in attrs:  # add_n declares its shape
        attrs["shape"] = (Const(b.size), *attrs["shape"])
    return Batched(b.op.prim, attrs, operand_rank=point_rank(b))


def reduce_axes(b: Batch) -> Batched:
    """A reduction over ``axes`` (all of them by default) reduces the same axes past the batch
    axis."""
    attrs = dict(b.op.attrs)
    rank = len(b.shapes[0])
    axes = attrs.get("axes")
    attrs["axes"] = tuple(range(1, rank + 1)) if axes is None else tuple(shift(a) for a in axes)
    return Batched(b.op.prim, attrs)


def one_axis(b: Batch) -> Batched:
    """An op along one ``axis`` works along the same axis past the batch axis."""
    attrs = dict(b.op.attrs)
    attrs["axis"] = shift(attrs["axis"])
    return Batched(b.op.prim, attrs)


def one_axis_all_batched(b: Batch) -> Batched:
    """``one_axis`` where every operand changes along the dim (no implicit broadcast)."""
    if not all(b.batched):
        raise Decline("an operand is the same at every point (would need an explicit broadcast)")
    return one_axis(b)


def new_shape(b: Batch) -> Batched:
    """An op that declares its result's ``shape`` gets the batch axis in front of it."""
    attrs = dict(b.op.attrs)
    attrs["shape"] = (Const(b.size), *attrs["shape"])
    return Batched(b.op.prim, attrs)


ELEMENTWISE = Batching(elementwise)
