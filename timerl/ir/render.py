"""Graphviz rendering of the PDG: one node per op, edges labelled with their index expressions."""

from __future__ import annotations

from collections.abc import Iterable

from timerl.ir.graph import Op
from timerl.symbolic import TRUE


def _quote(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def to_dot(ops: Iterable[Op]) -> str:
    """Dot source; render with ``dot -Tsvg`` or the ``graphviz`` package."""
    lines = ["digraph pdg {", "  rankdir=LR;", '  node [shape=box, fontname="monospace"];']
    for op in ops:
        dom = ",".join(d.name for d in op.domain)
        shape = "x".join(map(str, op.shape)) or "scalar"
        style = ', style=filled, fillcolor="#ffe0c0"' if op.effect else ""
        text = _quote(f"{op.label}[{dom}]")[:-1] + "\\n" + f"{op.prim} {shape} {op.dtype}" + '"'
        lines.append(f"  n{op.id} [label={text}{style}];")
        for e in op.inputs:
            label = ",".join(map(str, e.index))
            if e.cond != TRUE:
                label += f" if {e.cond}"
            lines.append(f"  n{e.src.id} -> n{op.id} [label={_quote(label)}];")
    lines.append("}")
    return "\n".join(lines)
