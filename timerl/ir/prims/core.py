"""What a primitive is: its entry in the registry (``Prim``), its typed traits, and the helpers
its inference and backward rules share.

An entry holds what the primitive *means*: shape/dtype inference, ``impl`` (the numpy
reference semantics, which constant folding evaluates and the numpy backend runs), the
backward (VJP) rule and typed traits (what passes and executors may rely on, so that none of
them tests a name). Backward rules build new ops through the ``ap`` callback
(``ir.build.apply``), so the registry needs nothing from the rest of the IR.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from timerl.ir.shapes import ONE, broadcast, promote
from timerl.symbolic import Expr, as_expr

Shape = tuple[Expr, ...]
Infer = Callable[[list[Shape], list[np.dtype], dict[str, Any]], tuple[Shape, np.dtype]]


@dataclass(frozen=True)
class Traits:
    """What passes, executors and exporters may rely on, so none of them tests a name.

    ``mergeable`` ops may be merged with a duplicate and folded when their inputs are
    constant; ``view`` ops may return (part of) an input's buffer, so they allocate nothing of
    their own; ``piecewise`` ops pick one input per point by the edges' conditions (the
    program's tensors); ``host`` ops call user Python (the function in their ``fn`` attr, on
    numpy arrays, outside any backend); ``constant`` ops hold a value fixed when the program is
    built; ``broadcast`` ops repeat their input along new or unit axes, so every element along
    those axes is the same; ``multi_output`` ops return a tuple of arrays that ``tuple_get``
    readers take apart (their declared shape and dtype describe nothing).
    """

    elementwise: bool = False
    reduction: bool = False
    view: bool = False
    random: bool = False
    piecewise: bool = False
    host: bool = False
    constant: bool = False
    stops_gradient: bool = False
    broadcast: bool = False
    multi_output: bool = False
    # its kernel always returns a new array of its own, never an input's buffer, so a later op
    # may write into it (donation)
    fresh: bool = False
    # its kernel may return (part of) an input's buffer on some backend (numpy's and torch's
    # basic indexing, a view, a merge handing on its branch, user Python returning what it was
    # given): while its value lives, a write into that input's buffer (a donation, a circular
    # buffer's row) would change it too. Every view has it; tests/ir/test_prims.py checks each
    # lowering that returns shared memory declares it
    shares_input: bool = False
    # a view of its whole input: ``"contiguous"`` when it is the input's buffer or a
    # contiguous view of a contiguous input (identity, detach, reshape), ``"strided"`` when it
    # is always a view but may be strided, so a reshape of it may copy (permute, expand);
    # storage lets a block's rows be read through such views without a copy
    whole_view: str | None = None

    @property
    def mergeable(self) -> bool:
        return not (self.random or self.piecewise or self.host)


def per_output(out_size: int, in_sizes: list[int], attrs: dict[str, Any]) -> float:
    """Default cost: one operation per output element."""
    return float(out_size)


def per_input(out_size: int, in_sizes: list[int], attrs: dict[str, Any]) -> float:
    """One operation per element of the first input (a reduction)."""
    return float(in_sizes[0])


def free(out_size: int, in_sizes: list[int], attrs: dict[str, Any]) -> float:
    """A view computes nothing."""
    return 0.0


@dataclass(frozen=True)
class Prim:
    name: str
    infer: Infer
    impl: Callable[..., Any]  # reference semantics (numpy): what constant folding evaluates
    vjp: Callable[..., list[Any]] | None = None
    elementwise: bool = False
    point_attrs: tuple[str, ...] = ()  # attrs that are index expressions, evaluated per point
    array_attrs: tuple[str, ...] = ()  # array-valued attrs, made the backend's arrays once
    keyed: bool = False  # pure random op: receives a counter-based key (seed, op, point)
    differentiable: bool = True
    extra: dict[str, Any] = field(default_factory=dict)
    traits: Traits = Traits()
    # cost estimate in elementary operations, from element counts (used to order and place)
    cost: Callable[[int, list[int], dict[str, Any]], float] = per_output


REGISTRY: dict[str, Prim] = {}


def register(prim: Prim) -> Prim:
    REGISTRY[prim.name] = prim
    return prim


def table_rule(table: dict[str, Any], prim: str, elementwise: Any, *unless: str) -> Any:
    """A transformation's rule for ``prim`` (JAX's model: each transformation keeps its own
    table): the table's entry, else ``elementwise`` for an elementwise primitive that has
    none of the ``unless`` traits, else None."""
    if prim in table:
        return table[prim]
    traits = get(prim).traits
    if traits.elementwise and not any(getattr(traits, t) for t in unless):
        return elementwise
    return None


def get(name: str) -> Prim:
    try:
        return REGISTRY[name]
    except KeyError:
        raise KeyError(f"unknown primitive {name!r}") from None


# --- inference helpers -----------------------------------------------------------------------


def same(shapes, dtypes, attrs):
    return shapes[0], dtypes[0]


def float_same(shapes, dtypes, attrs):
    dt = dtypes[0] if np.issubdtype(dtypes[0], np.floating) else np.dtype("float32")
    return shapes[0], dt


def bool_same(shapes, dtypes, attrs):
    return shapes[0], np.dtype(bool)


def binary(shapes, dtypes, attrs):
    return broadcast(*shapes), promote(*dtypes)


def compare(shapes, dtypes, attrs):
    return broadcast(*shapes), np.dtype(bool)


def declared(shapes, dtypes, attrs):
    """The shape and dtype the op's attributes declare (sources, host calls, merges)."""
    return tuple(as_expr(s) for s in attrs["shape"]), np.dtype(attrs["dtype"])


def attr_shape(shapes, dtypes, attrs):
    """The shape attribute, the first input's dtype."""
    return tuple(as_expr(x) for x in attrs["shape"]), dtypes[0]


# --- backward helpers: ``ap(prim, *views, **attrs)`` builds an op and returns its view --------


def unbroadcast(ap, g, shape: Shape):
    """Sum a gradient back to an operand's shape after broadcasting."""
    gshape = g.shape
    lead = len(gshape) - len(shape)
    axes = list(range(lead))
    axes += [lead + k for k, s in enumerate(shape) if s == ONE and gshape[lead + k] != ONE]
    if axes:
        g = ap("sum", g, axes=tuple(axes), keepdims=True)
        if lead:
            g = ap("reshape", g, shape=tuple(shape))
    return g


def scalar(ap, value: float, like):
    """A constant of ``like``'s dtype, broadcast where it is used."""
    return ap("full", shape=(), value=value, dtype=like.dtype)


def swap_last(ap, x):
    """``x`` with its last two axes swapped (a batch of transposes)."""
    rank = len(x.shape)
    perm = tuple(range(rank - 2)) + (rank - 1, rank - 2)
    return ap("permute", x, perm=perm)
