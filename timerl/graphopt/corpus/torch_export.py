"""The corpus's PyTorch importer: :mod:`timerl.graphopt.torch_import`, which also serves
:func:`timerl.graphopt.from_torch`. The corpus's training graphs are forward and backward only
(``graph_from_module(..., training=True)`` adds no optimizer step), so that the graphs it holds
stay those it was measured on.
"""

from __future__ import annotations

from timerl.graphopt.torch_import import (
    BYTES_PER_S,
    FLOPS_PER_S,
    OP_OVERHEAD_S,
    VIEW_OVERHEAD_S,
    graph_from_fx,
    graph_from_module,
)

__all__ = [
    "BYTES_PER_S",
    "FLOPS_PER_S",
    "OP_OVERHEAD_S",
    "VIEW_OVERHEAD_S",
    "graph_from_fx",
    "graph_from_module",
]
