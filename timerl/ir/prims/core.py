"""What a primitive is: its entry in the registry (``Prim``), its typed traits, and the helpers
its inference and backward rules share.

An entry holds what the primitive *means*: shape/dtype inference, ``impl`` (the numpy
reference semantics, which constant folding evaluates and the numpy backend runs), the
backward (VJP) rule and typed traits (what passes and executors may rely on, so that none of
them tests a name). Backward rules build new ops through the ``ap`` callback
(``ir.build.apply``), so an entry needs nothing from the rest of the IR (the rule tables
beside it read ops, ``ir.graph``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from timerl.ir.prims.cost import Counts, estimate
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
    # its value is its one input's, unchanged (identity, detach: gradients are built before
    # compiling, so a detach computes nothing)
    same_value: bool = False
    # it lays its input's elements out in the shape of its ``shape`` attribute, row-major: a
    # view of a contiguous input, a copy of a strided one
    reshapes: bool = False
    # it takes one part (attribute ``item``) of the tuple a host or multi-output op returns
    tuple_part: bool = False
    # an elementwise binary op's ring operation, ``"add"`` or ``"mul"``: passes that match an
    # algebraic form (a linear recurrence ``a + c * x``) ask it, not the primitive's name
    algebra: str | None = None

    @property
    def mergeable(self) -> bool:
        return not (self.random or self.piecewise or self.host)


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
    # for an op that returns a view of its input for some attributes only (``getitem`` with a
    # basic key): whether these attributes make it one
    view_when: Callable[[Mapping[str, Any]], bool] | None = None

    def returns_view(self, attrs: Mapping[str, Any]) -> bool:
        """Whether an op of this primitive with ``attrs`` hands back (a view of) its one
        input's buffer: every view, and a primitive that is one for these attributes."""
        return self.traits.view or (self.view_when is not None and self.view_when(attrs))

    def cost(self, out: int, ins: Sequence[int], attrs: Mapping[str, Any]) -> float:
        """Elementary operations from element counts (``ir/prims/cost.py``: the one model)."""
        return estimate(self.name, Counts(int(out), tuple(int(n) for n in ins)), attrs)


REGISTRY: dict[str, Prim] = {}
# attributes that say how an op is run (its random stream, where its domain comes from, whether
# a host call is given its point), not what it computes
HIDDEN_ATTRS = frozenset({"stream", "adopt_domain", "pass_point"})


def register(prim: Prim) -> Prim:
    REGISTRY[prim.name] = prim
    return prim


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
