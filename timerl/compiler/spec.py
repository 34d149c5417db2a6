"""The program spec: what a context freezes into before compilation.

``compile(spec)`` is a function over values (as a jaxpr is in JAX): the spec holds a private
copy of the graph its roots reach, so nothing a pass does can reach the user's context or
another program compiled from it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from timerl.ir.graph import Op, copy_graph, walk
from timerl.symbolic import Bound, Dim

VALIDATION_SIZE = 16  # bound used to validate a dynamic dim that has no cap


@dataclass(frozen=True)
class ProgramSpec:
    """Roots (effects, sinks, outputs), dims, bounds and dynamic stops of one program."""

    ops: tuple[Op, ...]  # every op the roots reach: a copy owned by this spec
    roots: tuple[Op, ...]
    outputs: tuple[Op, ...]  # in the order asked for; also among ``roots``
    dims: tuple[Dim, ...]
    until: Mapping[Dim, Op]  # dim -> the boolean op that ends it
    static: Mapping[Bound, int]
    dynamic: Mapping[Bound, int | None]  # bound -> static cap (None: no cap)

    @property
    def check_bounds(self) -> dict[Bound, int]:
        """Bounds to validate with: a dynamic bound's cap, or a small size without one."""
        check = dict(self.static)
        for b, cap in self.dynamic.items():
            check[b] = cap if cap is not None else VALIDATION_SIZE
        return check

    @property
    def keep(self) -> set[int]:
        """Ops whose values outlive the run: outputs and the dynamic stops."""
        return {op.id for op in self.outputs} | {op.id for op in self.until.values()}

    @property
    def ragged(self) -> dict[Bound, frozenset[Dim]]:
        """The bounds of dims ended by ``until`` whose stop varies over other dims too, and
        those dims: each of their points has a length of its own (``done[i, t]``: one
        episode length per ``i``)."""
        out: dict[Bound, frozenset[Dim]] = {}
        for dim, stop in self.until.items():
            others = frozenset(stop.domain) - {dim}
            if others:
                out[dim.bound] = others
        return out

    def with_ops(self, ops: Sequence[Op]) -> ProgramSpec:
        """The same program over a rewritten graph (roots are found again by id)."""
        by_id = {op.id: op for op in ops}
        return replace(
            self,
            ops=tuple(ops),
            roots=tuple(by_id[r.id] for r in self.roots),
            outputs=tuple(by_id[o.id] for o in self.outputs),
            until={d: by_id[op.id] for d, op in self.until.items()},
        )


def freeze(
    roots: Sequence[Op],
    outputs: Sequence[Op],
    dims: Sequence[Dim],
    until: Mapping[Dim, Op],
    static: Mapping[Bound, int],
    dynamic: Mapping[Bound, int | None],
) -> ProgramSpec:
    everything = list(roots) + list(outputs) + list(until.values())
    ops = copy_graph(walk(everything))
    by_id = {op.id: op for op in ops}
    new_roots = tuple(dict.fromkeys(by_id[r.id] for r in everything))
    return ProgramSpec(
        ops=tuple(ops),
        roots=new_roots,
        outputs=tuple(by_id[o.id] for o in outputs),
        dims=tuple(dims),
        until={d: by_id[op.id] for d, op in until.items()},
        static=dict(static),
        dynamic=dict(dynamic),
    )
