"""How an op is called at a point, decided once for every way a statement runs.

What the generated code calls (``statements.py``, and the fused calls of ``regions.py`` and
``loop_regions.py``), with which attributes bound up front, which attributes are evaluated per
point, and the key a random op draws from, is decided here, so they cannot drift apart.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from timerl.ir import prims
from timerl.ir.graph import Edge, Op
from timerl.runtime.backend import Backend
from timerl.schedule.point_attrs import key_coordinates, key_stream, point_attrs
from timerl.symbolic import Expr, Slice

# Attributes that describe the op to the compiler, never passed to a kernel.
META_ATTRS = frozenset({"stream", "adopt_domain", "pass_point"})


@dataclass(frozen=True)
class OpCall:
    """``fn(*inputs, **point_attrs, key=...)`` computes the op at one point.

    ``point_attrs`` are ``(name, value)`` with ``value`` an index expression, a literal, or a
    tuple of those, evaluated at each point. ``key`` is ``None`` or, for a random op, the
    ``(seed, stream)`` prefix and the coordinates (expressions) that complete its key.
    ``pass_point``: a host op that receives the point as its last argument. ``out``: the
    position of the input whose buffer ``fn`` writes into, passed again as ``out=``. ``row``:
    ``fn`` writes into the op's own row of its block, passed as ``out=``.
    """

    fn: Callable[..., Any]
    point_attrs: tuple[tuple[str, Any], ...]
    key: tuple[tuple[int, int], tuple[Any, ...]] | None
    pass_point: bool
    out: int | None = None
    row: bool = False


def host_call(
    op: Op, backend: Backend, attr: str = "fn", native: bool = True
) -> Callable[..., Any]:
    """Call the user function of a host op on numpy arrays, returning backend arrays
    (``attr="begin"``: the function that starts it, see ``schedule/overlap.py``); numpy
    arrays when not ``native`` (only host calls read it: jax spends 0.1 ms making an array)."""
    to_np, fn = backend.to_numpy, op.attrs[attr]
    # a backend's ``asarray`` takes what numpy's takes
    as_native = backend.asarray if native else np.asarray

    def native(out: Any) -> Any:
        # a list, not a generator: an env step returns three arrays at every step
        if isinstance(out, tuple):
            return tuple([as_native(o) for o in out])
        return None if out is None else as_native(out)

    def call(*xs: Any) -> Any:
        if len(xs) == 1:  # an env step's action
            return native(fn(to_np(xs[0])))
        return native(fn(*[to_np(x) for x in xs]))

    def call_at(*xs: Any) -> Any:
        *args, point = xs
        return native(fn(*[to_np(x) for x in args], point))

    return call_at if op.attrs.get("pass_point", False) else call


def prepare_call(
    op: Op, backend: Backend, seed: int, donate: int | None = None, row: bool = False
) -> OpCall:
    """The kernel with static attributes bound, and what is left to evaluate per point.

    ``donate``: the position of an input whose buffer the kernel writes its result into
    (``memory/donation.py``), through the backend's donating lowering; ``row``: the kernel
    writes into the op's row of its block instead (``Storage.in_place``), through the same."""
    rule = prims.get(op.prim)
    traits = rule.traits
    if traits.piecewise:
        raise ValueError(f"{op.where()} is piecewise: the executor picks its branch, not a kernel")
    if traits.host:
        return OpCall(host_call(op, backend), (), None, bool(op.attrs.get("pass_point", False)))
    per_point = set(rule.point_attrs)
    static = {
        k: backend.asarray(v) if k in rule.array_attrs else v
        for k, v in op.attrs.items()
        if k not in per_point and k not in META_ATTRS
    }
    kernel = backend.kernel(op)
    if donate is not None or row:
        writer = backend.donating_lowering(op.prim)
        if writer is None:
            raise ValueError(f"{op.where()}: the {backend.name} backend cannot write into inputs")
        kernel = writer
    fn = functools.partial(kernel, **static) if static else kernel
    coords = key_coordinates(op)
    key = None if coords is None else ((seed, key_stream(op)), coords)
    return OpCall(fn, point_attrs(op), key, False, donate, row)


def gather_points(
    store: dict, axes: list, kinds: list[bool], stack: Callable, missing: Callable, empty: Callable
) -> Any:
    """Stack the points of a (multi-)slice read; ragged shapes stay a list. A store holding
    the slice's rows stacked already (``stores.RowStore``) hands them over as they are."""
    stacked = getattr(store, "stacked", None)
    if stacked is not None and all(kinds[-1:]) and not any(kinds[:-1]):
        rows = axes[-1]
        if rows.start == 0 and rows.step == 1:
            found = stacked(tuple(a[0] for a in axes[:-1]), len(rows))
            if found is not None:
                return found

    if kinds and kinds[-1] and not any(kinds[:-1]):
        # one slice, the last coordinate (a loop's rows at one outer point): the rows read
        # in one pass, not a recursion per row (a rollout's 128 rows, 17 gathers an iteration)
        head = tuple(a[0] for a in axes[:-1])
        try:
            items = [store[head + (p,)] for p in axes[-1]]
        except KeyError:
            items = None  # a missing point: the general walk below names it
        if items:
            return _stacked_if_uniform(items, stack)

    def rec(prefix: tuple, level: int) -> Any:
        if level == len(axes):
            try:
                return store[prefix]
            except KeyError:
                return missing(prefix)
        if not kinds[level]:
            return rec(prefix + (axes[level][0],), level + 1)
        items = [rec(prefix + (p,), level + 1) for p in axes[level]]
        if not items:
            rest = tuple(
                len(a) for a, k in zip(axes[level + 1 :], kinds[level + 1 :], strict=True) if k
            )
            return empty((0,) + rest)
        return _stacked_if_uniform(items, stack)

    return rec((), 0)


def _stacked_if_uniform(items: list, stack: Callable) -> Any:
    """``items`` stacked where they are arrays of one shape; ragged ones stay a list."""
    if any(isinstance(x, list) for x in items):
        return items
    if len({tuple(getattr(x, "shape", ())) for x in items}) == 1:
        return stack(items)
    return items


def element_shape(edge: Edge) -> tuple[Expr, ...]:
    """The shape of one point of ``edge.src`` in terms of the reader's point (a slice's start
    stands for the sliced dim, which the shape cannot depend on): what an empty slice of a
    tensor whose shape changes from point to point is made of."""
    at = {
        d: (idx.start if isinstance(idx, Slice) else idx)
        for d, idx in zip(edge.src.domain, edge.index, strict=True)
    }
    return tuple(s.substitute(at) for s in edge.src.shape)
