"""The cost model: each primitive's arithmetic, in elementary operations, from the element
counts its caller measures.

One model for every user: the compiler's block graphs (``schedule/to_graph.py``, whose costs
graphopt's op order reads, and which the graph corpus the shipped policy learned from was
built with) and the choice between numpy kernels and a jitted call (``runtime/regions.py``,
through ``Prim.cost``). A rule reads ``Sizes``: the elements of the result and of each
operand as read, and where its caller measures shapes, one axis of an operand; how those are
counted (static shapes, the largest over a loop's points) is the caller's business.

The counts: one operation per element of the result by default; a reduction one per element
it reads; a view none; a matrix product ``2 m n k``; a sort ``n ceil(log2 n)``. ``take_matmul``
and ``linear_scan`` are counted by their result (the corpus counts them so; their arithmetic is
``2 rows k n`` and ``2 n``), as ``sumsq`` by what it reads.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from timerl.ir.prims.table import RuleTable


class Sizes(Protocol):
    """What a cost rule reads, measured by its caller."""

    def out(self) -> int:
        """Elements of the result (of a tuple: of its parts)."""
        ...

    def read(self, k: int) -> int:
        """Elements of operand ``k`` as read (a slice read: every point of it)."""
        ...

    def axis(self, k: int, axis: int) -> int | None:
        """The size of one axis of operand ``k`` as read; None where the caller has no shapes."""
        ...


@dataclass(frozen=True)
class Counts:
    """``Sizes`` from element counts known up front (no shapes)."""

    out_elems: int
    in_elems: tuple[int, ...]

    def out(self) -> int:
        return self.out_elems

    def read(self, k: int) -> int:
        return self.in_elems[k]

    def axis(self, k: int, axis: int) -> int | None:
        return None


CostRule = Callable[[Sizes, Mapping[str, Any]], float]

TABLE: RuleTable[CostRule] = RuleTable("cost", "a cost rule (schedule/to_graph.py, runtime)")


def estimate(prim: str, sizes: Sizes, attrs: Mapping[str, Any]) -> float:
    """The elementary operations of an op of ``prim`` (one per element of its result for an
    op outside the registry)."""
    rule = TABLE.rule(prim)
    return float(sizes.out()) if rule is None else float(rule(sizes, attrs))


# --- rules -------------------------------------------------------------------------------------


def per_output(sizes: Sizes, attrs: Mapping[str, Any]) -> float:
    """One operation per element of the result."""
    return float(sizes.out())


def per_input(sizes: Sizes, attrs: Mapping[str, Any]) -> float:
    """One operation per element of the first operand (a reduction)."""
    return float(sizes.read(0))


def free(sizes: Sizes, attrs: Mapping[str, Any]) -> float:
    """A view computes nothing."""
    return 0.0


def product(sizes: Sizes, attrs: Mapping[str, Any]) -> float:
    """``2 m n k`` for a (batched) matrix product: the result's elements times twice the
    contracted size (its first operand's last axis; derived from the counts, ``m k`` times
    ``k n`` over ``m n``, where the caller measures no axis: exact for a product where at most
    one operand has batch axes)."""
    out = sizes.out()
    inner = sizes.axis(0, -1)
    if inner is None:
        return 2.0 * out * (sizes.read(0) * sizes.read(1) / max(out, 1)) ** 0.5
    return 2.0 * out * inner


def sort(sizes: Sizes, attrs: Mapping[str, Any]) -> float:
    """``n ceil(log2 n)`` comparisons (at least ``n``)."""
    n = sizes.out()
    return float(n * max(1, math.ceil(math.log2(max(n, 2)))))
