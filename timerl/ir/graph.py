"""The polyhedral dependence graph: ops over domains, edges carrying index expressions.

The graph is a value: ops hold their input edges, and a program is the set of ops reachable
from its outputs. There is no global "current graph"; the API's context only remembers which
ops are roots (sinks, effects, tensors asked for).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from timerl.errors import ProgramError
from timerl.symbolic import TRUE, Condition, Dim, Expr, Index, Slice, as_expr
from timerl.symbolic.bounds import always_lt0

_op_ids = itertools.count()

Shape = tuple[Expr, ...]


@dataclass(eq=False)
class Edge:
    """``sink`` reads ``src`` at ``index`` (one entry per dim of ``src.domain``) where ``cond``."""

    src: Op
    index: tuple[Index, ...]
    cond: Condition = TRUE

    def __repr__(self) -> str:
        idx = ", ".join(map(str, self.index))
        cond = "" if self.cond == TRUE else f" if {self.cond}"
        return f"{self.src.label}[{idx}]{cond}"


@dataclass(eq=False)
class Op:
    """One node of the PDG.

    ``shape`` may depend on the op's own dims (``x[0:t+1]`` has ``t + 1`` rows at point ``t``).
    ``effect`` marks side-effecting ops (environment calls, sinks): they are roots, never
    duplicated, vectorised or reordered.
    """

    prim: str
    domain: tuple[Dim, ...]
    shape: Shape
    dtype: np.dtype
    inputs: list[Edge] = field(default_factory=list)
    attrs: dict[str, Any] = field(default_factory=dict)
    name: str | None = None
    site: str | None = None
    effect: bool = False
    id: int = field(default_factory=lambda: next(_op_ids))
    guard: Condition = TRUE  # points actually computed (set by the compiler's guard analysis)

    @property
    def label(self) -> str:
        return self.name or f"{self.prim}#{self.id}"

    def unwired(self, **changes: Any) -> Op:
        """A copy with the same id and no inputs yet (graphs with cycles are copied in two
        steps: every op, then every edge); ``changes`` replace fields."""
        return replace(self, inputs=[], attrs=dict(self.attrs), **changes)

    def where(self) -> str:
        """The tensor's name and the user's source line, for error messages."""
        return f"{self.label}" + (f" (defined at {self.site})" if self.site else "")

    def __repr__(self) -> str:
        dom = ",".join(d.name for d in self.domain)
        return f"{self.label}[{dom}]{tuple(self.shape)}:{self.dtype}"


@dataclass(frozen=True, eq=False)
class View:
    """An op read at an index: what ``x[t - 1]`` or ``x[0:T]`` denotes before it is used.

    Its domain is the dims its index expressions mention; each slice adds a leading spatial
    dim whose size may depend on the point.
    """

    op: Op
    index: tuple[Index, ...]

    @staticmethod
    def of(op: Op) -> View:
        return View(op, tuple(op.domain))

    @property
    def is_identity(self) -> bool:
        return all(i is d for i, d in zip(self.index, self.op.domain, strict=True))

    @property
    def dims(self) -> frozenset[Dim]:
        out: set[Dim] = set()
        for idx in self.index:
            out.update(s for s in idx.symbols() if isinstance(s, Dim))
        return frozenset(out)

    @property
    def shape(self) -> Shape:
        points = {
            d: i for d, i in zip(self.op.domain, self.index, strict=True) if isinstance(i, Expr)
        }
        lead = tuple(i.size for i in self.index if isinstance(i, Slice))
        own = tuple(s.substitute(points) for s in self.op.shape)
        sliced = {
            d for d, i in zip(self.op.domain, self.index, strict=True) if isinstance(i, Slice)
        }
        if lead and any(s.symbols() & sliced for s in self.op.shape):
            raise ProgramError(
                f"cannot gather a slice of {self.op.where()}: its shape {self.op.shape} changes "
                "from point to point"
            )
        return lead + own

    @property
    def dtype(self) -> np.dtype:
        return self.op.dtype

    def edge(self, cond: Condition = TRUE) -> Edge:
        return Edge(self.op, self.index, cond)


def order_dims(dims: Iterable[Dim], order: Sequence[Dim]) -> tuple[Dim, ...]:
    """Dims in context order (outer first)."""
    dims = set(dims)
    unknown = dims - set(order)
    if unknown:
        raise ProgramError(f"dims {sorted(d.name for d in unknown)} do not belong to this context")
    return tuple(d for d in order if d in dims)


def as_shape(shape: Iterable[Any]) -> Shape:
    return tuple(as_expr(s) for s in shape)


def walk(roots: Iterable[Op]) -> list[Op]:
    """Every op reachable from ``roots`` through input edges, in a deterministic order."""
    seen: dict[int, Op] = {}
    stack = list(roots)
    while stack:
        op = stack.pop()
        if op.id in seen:
            continue
        seen[op.id] = op
        stack.extend(e.src for e in op.inputs)
    return sorted(seen.values(), key=lambda o: o.id)


def consumers(ops: Iterable[Op]) -> dict[int, list[tuple[Op, Edge]]]:
    """For each op id, the (consumer, edge) pairs that read it."""
    out: dict[int, list[tuple[Op, Edge]]] = {}
    for op in ops:
        out.setdefault(op.id, [])
        for e in op.inputs:
            out.setdefault(e.src.id, []).append((op, e))
    return out


def carried(edge: Edge, dim: Dim) -> bool:
    """The edge reads another point of a dim outside ``dim``'s loop (``i - 1`` for ``u``): it
    links two points of that outer dim, no part of a dependence within one run of ``dim``'s
    loop. A read that moves along a dim nested inside ``dim`` (``s - 1`` of a recurrence over
    ``s`` inside each ``t``) stays within one point of ``dim`` and is not carried: through it
    a value at ``t`` can depend on another value at the same ``t``. Where the source is not
    over ``dim``, every other dim it moves along counts."""
    domain = edge.src.domain
    outer = domain[: domain.index(dim)] if dim in domain else domain
    for d, idx in zip(outer, edge.index, strict=False):
        if idx is d or isinstance(idx, Slice) or d not in idx.symbols():
            continue
        if always_lt0(idx - d) or always_lt0(d - idx):
            return True
    return False


def mentions(op: Op, symbol: Any) -> bool:
    """Whether ``symbol`` (a dim or a bound) appears in ``op``'s shape, attributes, guard, or
    the index or condition of a read."""
    items: list[Any] = [*op.shape, *op.attrs.values(), op.guard]
    for e in op.inputs:
        items += [*e.index, e.cond]
    return mentioned_in(items, symbol)


def mentioned_in(items: Iterable[Any], symbol: Any) -> bool:
    """Whether ``symbol`` appears in any index expression, slice or condition among ``items``
    (tuples and lists of them looked into; anything else, an array or a number, skipped)."""
    stack = list(items)
    while stack:
        x = stack.pop()
        if isinstance(x, (tuple, list)):
            stack.extend(x)
        elif isinstance(x, (Expr, Slice, Condition)) and symbol in x.symbols():
            return True
    return False


def iter_edges(ops: Iterable[Op]) -> Iterator[tuple[Op, Edge]]:
    for op in ops:
        for e in op.inputs:
            yield op, e


def copy_graph(
    ops: Iterable[Op],
    redirect: dict[int, Op] | None = None,
    guards: dict[int, Condition] | None = None,
    domains: dict[int, tuple[Dim, ...]] | None = None,
) -> list[Op]:
    """A private copy of ``ops`` (same ids), so a pass can change it without touching the
    graph the user's context or another compiled program holds.

    ``redirect`` maps an op id to the op its readers read instead (merged duplicates, folded
    constants); redirected ops are dropped. ``guards`` gives copied ops their domain condition.
    ``domains`` gives ops another domain: edges reading such an op drop their index for the
    dims it lost (hoisted out of loops) and read a dim it gained at their own point.
    Ops are created first and wired second, because recurrences make the graph cyclic.
    """
    redirect = redirect or {}
    guards = guards or {}
    domains = domains or {}
    kept = [op for op in ops if op.id not in redirect]
    new: dict[int, Op] = {}
    for op in kept:
        new[op.id] = op.unwired(
            domain=domains.get(op.id, op.domain), guard=guards.get(op.id, op.guard)
        )

    def target(src: Op) -> Op:
        seen = 0
        while src.id in redirect:  # a chain of redirects ends at a kept op
            src = redirect[src.id]
            seen += 1
            if seen > len(redirect):
                raise ProgramError("internal error: cyclic redirect between ops")
        return new.get(src.id, src)

    def reindex(old: Op, src: Op, index: tuple[Index, ...]) -> tuple[Index, ...]:
        if src.domain == old.domain:
            return index
        given = dict(zip(old.domain, index, strict=True))
        return tuple(given.get(d, d) for d in src.domain)

    for op in kept:
        new[op.id].inputs = [
            Edge(dst, reindex(e.src, dst, e.index), e.cond)
            for e in op.inputs
            for dst in (target(e.src),)
        ]
    return list(new.values())
