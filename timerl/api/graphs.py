"""A compiled program's loop bodies as graphopt graphs (what graphopt's corpus holds of
timerl's own programs).

The block translator is ``timerl.schedule.to_graph``, the one the compiler's op order uses;
this cuts a compiled program's schedule into its blocks and names each graph."""

from __future__ import annotations

from typing import TYPE_CHECKING

from timerl.compiler.spec import VALIDATION_SIZE
from timerl.ir.graph import consumers
from timerl.schedule.to_graph import MIN_OPS, block_graph, loop_blocks
from timerl.symbolic import Bound

if TYPE_CHECKING:
    from timerl.api.program import Program
    from timerl.graphopt.graph import Graph

__all__ = ["MIN_OPS", "program_graphs"]


def program_graphs(prog: Program, name: str, *, min_ops: int = MIN_OPS) -> list[Graph]:
    """One graph per block of ``prog``'s loop bodies with at least ``min_ops`` ops.

    Graphs are named ``{name}-{k}-{dims}``: ``k`` numbers the exported blocks in schedule order,
    ``dims`` lists the enclosing loops (``i_t``: the ``t`` loop inside the ``i`` loop).
    """
    bounds: dict[Bound, int] = dict(prog.static)
    for bound, cap in prog.dynamic.items():
        bounds[bound] = cap if cap is not None else VALIDATION_SIZE
    readers = consumers(prog.ops)
    keep = set(prog.keep)
    graphs = []
    for block in loop_blocks(prog.schedule.body):
        if len(block.ops) < min_ops:
            continue
        dims = "_".join(d.name for d in block.dims)
        label = f"{name}-{len(graphs)}-{dims}"
        graphs.append(block_graph(block, bounds, readers, keep, label)[0])
    return graphs
